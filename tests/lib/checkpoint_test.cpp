// Checkpoints: state_dict names as torch builds them, safetensors files (round trips, every kind of
// malformed file, Python's safetensors reading kiln's files and writing files kiln reads), loads
// that fail leave the module untouched, and training resumed from a checkpoint continues bit for
// bit (eager and traced), the random generator's state included.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kiln/jit.h"
#include "kiln/kiln.h"
#include "kiln/serialize.h"
#include "tests/testing.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using testing::bytes;
using testing::expect_error;

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() /
          ("kiln_checkpoint_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

void write_bytes(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary)
      .write(data.data(), static_cast<std::streamsize>(data.size()));
}

// A safetensors file from a header's JSON text and the data section, for malformed files.
std::string craft(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.sizes() == b.sizes() && bytes(a) == bytes(b);
}

// Every tensor of `dict` bit for bit, copied (a later in-place update must not change it).
StateDict snapshot(const StateDict& dict) {
  StateDict out;
  for (const auto& [k, v] : dict) out.insert(k, v.clone());
  return out;
}

void expect_same_bits(const StateDict& a, const StateDict& b) {
  ASSERT_EQ(a.keys(), b.keys());
  for (const auto& [k, v] : a) EXPECT_TRUE(same_bits(v, b.at(k))) << k;
}

// A module as a torch user writes one: named submodules, one of them a Sequential.
struct Net : nn::Module {
  std::shared_ptr<nn::Sequential> layers;
  std::shared_ptr<nn::BatchNorm1d> bn;
  std::shared_ptr<nn::Linear> head;
  Net() {
    layers = register_module(
        "layers", std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<Module>>{
                      std::make_shared<nn::Linear>(4, 8), std::make_shared<nn::ReLU>(),
                      std::make_shared<nn::Linear>(8, 8, false)}));
    bn = register_module("bn", std::make_shared<nn::BatchNorm1d>(8));
    head = register_module("head", std::make_shared<nn::Linear>(8, 2));
    register_buffer("scale", full({2}, 0.5));
  }
  Tensor forward(const Tensor& x) override {
    return head->forward(bn->forward(layers->forward(x)));
  }
};

TEST(StateDict, NamesAndOrderAreTorchs) {
  Net net;
  StateDict d = net.state_dict();
  // torch: each module's parameters, then its buffers, then its children in order.
  const std::vector<std::string> want = {
      "scale",    "layers.0.weight", "layers.0.bias",  "layers.2.weight",        "bn.weight",
      "bn.bias",  "bn.running_mean", "bn.running_var", "bn.num_batches_tracked", "head.weight",
      "head.bias"};
  EXPECT_EQ(d.keys(), want);
  EXPECT_EQ(d.at("bn.num_batches_tracked").dtype(), kInt64);
  EXPECT_EQ(d.at("layers.0.weight").sizes(), (Shape{8, 4}));
  // Detached handles on the module's own storage.
  EXPECT_FALSE(d.at("head.weight").requires_grad());
  net.head->weight.detach().fill_(3.0);
  EXPECT_EQ(d.at("head.weight").to_vector<float>()[0], 3.0f);
}

TEST(StateDict, LoadCopiesIntoTheModuleAndReportsKeysWhenNotStrict) {
  manual_seed(1);
  Net a;
  manual_seed(2);
  Net b;
  a.bn->forward(randn({5, 8}));  // running stats and num_batches_tracked move
  b.load_state_dict(a.state_dict());
  expect_same_bits(b.state_dict(), a.state_dict());
  EXPECT_TRUE(b.head->weight.requires_grad());  // still the module's trainable leaf

  StateDict partial;
  partial.insert("head.bias", zeros({2}));
  partial.insert("extra", zeros({1}));
  LoadStateDictResult r = b.load_state_dict(partial, /*strict=*/false);
  EXPECT_EQ(r.unexpected_keys, std::vector<std::string>{"extra"});
  EXPECT_EQ(r.missing_keys.size(), a.state_dict().size() - 1);
  EXPECT_TRUE(equal(b.head->bias, zeros({2})));
}

TEST(StateDict, LoadingItsOwnStateDictChangesNothing) {
  manual_seed(2);
  Net net;
  const StateDict before = snapshot(net.state_dict());
  net.load_state_dict(net.state_dict());  // every source is the destination itself
  expect_same_bits(net.state_dict(), before);
}

TEST(StateDict, FailedLoadLeavesTheModuleBitIdentical) {
  manual_seed(3);
  Net net;
  const StateDict before = snapshot(net.state_dict());
  // The first entry would load fine: a load that wrote as it went would change it.
  StateDict bad;
  bad.insert("scale", full({2}, 7.0));
  for (const auto& [k, v] : before)
    if (k != "scale") bad.insert(k, zeros_like(v));
  bad.insert("head.weight", zeros({3, 8}));  // wrong shape
  expect_error([&] { net.load_state_dict(bad); },
               {"load_state_dict", "size mismatch", "head.weight", "[3, 8]", "[2, 8]"});
  expect_same_bits(net.state_dict(), before);

  StateDict extra = snapshot(before);
  extra.insert("scale", full({2}, 7.0));
  extra.insert("layers.5.weight", zeros({1}));
  expect_error([&] { net.load_state_dict(extra); }, {"unexpected", "layers.5.weight"});
  expect_same_bits(net.state_dict(), before);

  StateDict missing;
  missing.insert("scale", full({2}, 7.0));
  expect_error([&] { net.load_state_dict(missing); }, {"missing", "head.bias"});
  expect_same_bits(net.state_dict(), before);
}

// ---------------------------------------------------------------- safetensors files

TEST(Safetensors, RoundTripsEveryDtypeLayoutAndMetadata) {
  StateDict d;
  d.insert("f32", from_vector<float>({0.5f, -1.25f, 1e-40f, 3.4e38f, -0.0f, 7.0f}, Shape{2, 3}));
  d.insert("f64", from_vector<double>({1.0 / 3.0, -2.5e300}));
  d.insert("i64", from_vector<int64_t>({INT64_MIN, 7, INT64_MAX}));
  d.insert("i32", from_vector<int32_t>({-5, INT32_MAX}));
  d.insert("b", from_vector(std::vector<bool>{true, false, true}));
  d.insert("scalar", scalar_tensor(3.25, kFloat64));
  d.insert("empty", zeros({0, 4}));
  d.insert("transposed", d.at("f32").t());  // a view: saved as its values in row-major order
  d.insert("pending", d.at("f32") * 2.0);
  const std::string path = temp_path("roundtrip.safetensors");
  save(path, d, {{"format", "kiln"}, {"step", "12"}});
  Metadata meta;
  StateDict got = load(path, &meta);
  EXPECT_EQ(meta, (Metadata{{"format", "kiln"}, {"step", "12"}}));
  ASSERT_EQ(got.keys(), d.keys());  // in the order saved
  for (const auto& [k, v] : d) EXPECT_TRUE(same_bits(got.at(k), v.contiguous())) << k;
  std::remove(path.c_str());
}

TEST(Safetensors, FileLayoutIsTheSpecs) {
  StateDict d;
  d.insert("a", from_vector<float>({1.0f, 2.0f}));
  d.insert("b", from_vector<int64_t>({3}));
  const std::string file = save_to_string(d);
  uint64_t n;
  std::memcpy(&n, file.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u) << "the data section starts 8-byte aligned";
  const std::string header = file.substr(8, n);
  EXPECT_NE(header.find(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})"),
            std::string::npos)
      << header;
  EXPECT_NE(header.find(R"("b":{"dtype":"I64","shape":[1],"data_offsets":[8,16]})"),
            std::string::npos)
      << header;
  EXPECT_EQ(file.size(), 8 + n + 16);
  float a1;
  std::memcpy(&a1, file.data() + 8 + n + 4, 4);
  EXPECT_EQ(a1, 2.0f);
}

TEST(Safetensors, MalformedFilesRaiseNamingTheFileAndTheProblem) {
  const std::string path = temp_path("bad.safetensors");
  const std::string eight(8, '\0'), sixteen(16, '\0'), twelve(12, '\0');
  auto expect_bad = [&](const std::string& file, std::vector<std::string> parts) {
    write_bytes(path, file);
    parts.push_back(path);
    expect_error([&] { load(path); }, parts);
  };
  const std::string good =
      craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", eight);
  expect_bad(good.substr(0, 5), {"truncated"});
  expect_bad(good.substr(0, good.size() - 3), {"[0, 8]", "out of range", "5 bytes"});
  std::string long_header = good;
  long_header[0] = 100;
  expect_bad(long_header, {"header length 100", "longer than the rest"});
  expect_bad(craft("{\"a\": [", eight), {"not valid JSON"});
  expect_bad(craft("[1, 2]", ""), {"must be a JSON object"});
  expect_bad(craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", eight),
             {"'a'", "out of range"});
  expect_bad(craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                   R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                   twelve),
             {"'b'", "overlaps", "'a'"});
  expect_bad(craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                   R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
                   std::string(20, '\0')),
             {"[8, 12)", "belong to no tensor"});
  expect_bad(craft(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", sixteen),
             {"[8, 16)", "belong to no tensor"});
  expect_bad(craft(R"({"a":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}})", eight),
             {"'a'", "unsupported dtype", "F16"});
  expect_bad(craft(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight),
             {"'a'", "[3]", "needs 12 bytes", "span 8"});
  expect_bad(craft(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight),
             {"'a'", "non-negative"});
  expect_bad(craft(R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", eight),
             {"'a'", "missing field 'shape'"});
  expect_bad(craft(R"({"a":{"dtype":"BOOL","shape":[1],"data_offsets":[0,1]}})", "\x02"),
             {"'a'", "byte 2"});
  expect_bad(craft(R"({"__metadata__":{"k":1}})", ""), {"__metadata__", "'k'", "string"});
  expect_error([&] { load(temp_path("does_not_exist")); }, {"can't open", "does_not_exist"});
  std::remove(path.c_str());
}

TEST(Safetensors, ModuleLoadFailuresNameTheFileAndChangeNothing) {
  manual_seed(4);
  Net net;
  const StateDict before = snapshot(net.state_dict());
  const std::string path = temp_path("module.safetensors");
  StateDict wrong = snapshot(before);
  wrong.insert("scale", full({2}, 9.0));
  wrong.insert("bn.running_var", ones({4}));
  save(path, wrong);
  expect_error([&] { load(path, net); }, {path, "size mismatch", "bn.running_var"});
  expect_same_bits(net.state_dict(), before);

  StateDict unknown = snapshot(before);
  unknown.insert("scale", full({2}, 9.0));
  unknown.insert("decoder.weight", ones({4}));
  save(path, unknown);
  expect_error([&] { load(path, net); }, {path, "unexpected", "decoder.weight"});
  expect_same_bits(net.state_dict(), before);
  load(path, net, /*strict=*/false);
  EXPECT_TRUE(equal(net.state_dict().at("scale"), full({2}, 9.0)));

  // A truncated file: nothing of it is applied.
  save(path, wrong);
  std::string file;
  {
    std::ifstream in(path, std::ios::binary);
    file.assign(std::istreambuf_iterator<char>(in), {});
  }
  write_bytes(path, file.substr(0, file.size() - 1));
  Net other;
  const StateDict other_before = snapshot(other.state_dict());
  expect_error([&] { load(path, other); }, {path, "out of range"});
  expect_same_bits(other.state_dict(), other_before);
  std::remove(path.c_str());
}

// ---------------------------------------------------------------- Python's safetensors

// The interop check's Python side: reads kiln's file with safetensors.numpy and checks every
// name, dtype, shape and value; then writes a file for kiln to read.
const char* kInteropScript = R"PY(
import sys
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

kiln_file, out_file = sys.argv[1], sys.argv[2]
want = {
    "layers.0.weight": np.array([[0.5, -1.25, 1e-40], [3.4e38, -0.0, 7.0]], dtype=np.float32),
    "transposed": np.array([[0.5, 3.4e38], [-1.25, -0.0], [1e-40, 7.0]], dtype=np.float32),
    "f64": np.array([1.0 / 3.0, -2.5e300], dtype=np.float64),
    "i64": np.array([-2**63, 7, 2**63 - 1], dtype=np.int64),
    "i32": np.array([-5, 2**31 - 1], dtype=np.int32),
    "b": np.array([True, False, True]),
    "scalar": np.array(3.25, dtype=np.float64),
    "bn.num_batches_tracked": np.array(4, dtype=np.int64),
}
got = load_file(kiln_file)
assert sorted(got) == sorted(want), (sorted(got), sorted(want))
for name, w in want.items():
    g = got[name]
    assert g.dtype == w.dtype and g.shape == w.shape, (name, g.dtype, g.shape, w.dtype, w.shape)
    assert g.tobytes() == w.tobytes(), (name, g, w)
with safe_open(kiln_file, "np") as f:
    assert f.metadata() == {"written_by": "kiln"}, f.metadata()

save_file({
    "0.weight": (np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5) / 8,
    "0.bias": np.array([1.5, -2.0, 1e-3], dtype=np.float32),
    "f64": np.array([[np.pi, -np.e]], dtype=np.float64),
    "i64": np.array([-2**40, 3], dtype=np.int64),
    "i32": np.array([[-7], [9]], dtype=np.int32),
    "b": np.array([False, True]),
    "scalar": np.array(2.5, dtype=np.float64),
}, out_file, metadata={"written_by": "python"})
print("python: kiln's file checked, python's written")
)PY";

// Runs `command` through the shell; its output and exit status.
std::pair<std::string, int> shell(const std::string& command) {
  std::string output;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {"popen failed", -1};
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) output.append(buffer, n);
  const int status = ::pclose(pipe);
  return {output, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

// A venv with safetensors and numpy, made once in the build tree beside the test binary
// ($KILN_INTEROP_VENV overrides where). Empty when pip can't install them (no network).
std::string interop_python(std::string* why) {
  const char* env = std::getenv("KILN_INTEROP_VENV");
  const fs::path venv =
      env ? fs::path(env) : fs::read_symlink("/proc/self/exe").parent_path() / "interop-venv";
  const std::string python = (venv / "bin" / "python").string();
  const std::string check = python + " -c 'import safetensors.numpy, numpy'";
  if (shell(check).second == 0) return python;
  auto [out, rc] =
      shell("python3 -m venv " + venv.string() + " && " + python +
            " -m pip install --quiet --disable-pip-version-check --timeout 30 --retries 1 "
            "safetensors numpy");
  if (rc != 0 || shell(check).second != 0) {
    *why = out;
    return "";
  }
  return python;
}

TEST(Safetensors, PythonReadsKilnsFilesAndKilnReadsPythons) {
  std::string why;
  const std::string python = interop_python(&why);
  if (python.empty())
    GTEST_SKIP() << "pip install safetensors numpy failed (no network?), so Python's side of the "
                    "interop check can't run:\n"
                 << why;
  StateDict d;
  Tensor w = from_vector<float>({0.5f, -1.25f, 1e-40f, 3.4e38f, -0.0f, 7.0f}, Shape{2, 3});
  d.insert("layers.0.weight", w);
  d.insert("transposed", w.t());
  d.insert("f64", from_vector<double>({1.0 / 3.0, -2.5e300}));
  d.insert("i64", from_vector<int64_t>({INT64_MIN, 7, INT64_MAX}));
  d.insert("i32", from_vector<int32_t>({-5, INT32_MAX}));
  d.insert("b", from_vector(std::vector<bool>{true, false, true}));
  d.insert("scalar", scalar_tensor(3.25, kFloat64));
  d.insert("bn.num_batches_tracked", scalar_tensor(int64_t{4}, kInt64));
  const std::string kiln_file = temp_path("to_python.safetensors");
  const std::string python_file = temp_path("from_python.safetensors");
  const std::string script = temp_path("interop.py");
  save(kiln_file, d, {{"written_by", "kiln"}});
  write_bytes(script, kInteropScript);
  auto [out, rc] = shell(python + " " + script + " " + kiln_file + " " + python_file);
  ASSERT_EQ(rc, 0) << out;

  Metadata meta;
  StateDict got = load(python_file, &meta);
  EXPECT_EQ(meta.at("written_by"), "python");
  std::vector<float> weight(12);
  for (int i = 0; i < 12; ++i) weight[i] = (static_cast<float>(i) - 5.5f) / 8;
  EXPECT_TRUE(same_bits(got.at("0.weight"), from_vector(weight, Shape{3, 4})));
  EXPECT_TRUE(same_bits(got.at("f64"), from_vector<double>({M_PI, -M_E}, Shape{1, 2})));
  EXPECT_TRUE(same_bits(got.at("i64"), from_vector<int64_t>({-(int64_t{1} << 40), 3})));
  EXPECT_TRUE(same_bits(got.at("i32"), from_vector<int32_t>({-7, 9}, Shape{2, 1})));
  EXPECT_TRUE(same_bits(got.at("b"), from_vector(std::vector<bool>{false, true})));
  EXPECT_TRUE(same_bits(got.at("scalar"), scalar_tensor(2.5, kFloat64)));
  // Python's file of a module's parameters loads into the kiln module.
  nn::Sequential net{std::make_shared<nn::Linear>(4, 3)};
  StateDict params;
  params.insert("0.weight", got.at("0.weight"));
  params.insert("0.bias", got.at("0.bias"));
  net.load_state_dict(params);
  EXPECT_TRUE(same_bits(net.state_dict().at("0.bias"), from_vector<float>({1.5f, -2.0f, 1e-3f})));
  for (const std::string& f : {kiln_file, python_file, script}) std::remove(f.c_str());
}

TEST(Safetensors, CudaModulesSaveAndLoad) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  manual_seed(8);
  nn::Linear a(3, 2), b(3, 2);
  a.to(kCUDA);
  b.to(kCUDA);
  const std::string path = temp_path("cuda.safetensors");
  save(path, a);
  StateDict file = load(path);
  EXPECT_EQ(file.at("weight").device(), kCPU);
  load(path, b);
  EXPECT_EQ(b.weight.device(), kCUDA);
  EXPECT_TRUE(same_bits(b.weight.to(kCPU), a.weight.to(kCPU)));
  std::remove(path.c_str());
}

// ---------------------------------------------------------------- optimizers

TEST(OptimizerStateDict, AdamKeysValuesAndRoundTrip) {
  manual_seed(5);
  nn::Linear lin(3, 2);
  optim::Adam adam(lin.parameters(), optim::AdamOptions{0.01, 0.8, 0.95, 1e-6, 0.1});
  for (int i = 0; i < 3; ++i) {
    adam.zero_grad();
    {
      Tensor out = lin.forward(randn({4, 3}));
      (out * out).sum().backward();
    }
    adam.step();
  }
  StateDict d = adam.state_dict();
  EXPECT_EQ(d.keys(),
            (std::vector<std::string>{"state.0.step", "state.0.exp_avg", "state.0.exp_avg_sq",
                                      "state.1.step", "state.1.exp_avg", "state.1.exp_avg_sq",
                                      "param_groups.0.lr", "param_groups.0.betas",
                                      "param_groups.0.eps", "param_groups.0.weight_decay",
                                      "param_groups.0.amsgrad", "param_groups.0.params"}));
  EXPECT_EQ(d.at("state.1.step").item<double>(), 3.0);
  EXPECT_EQ(d.at("param_groups.0.betas").to_vector<double>(), (std::vector<double>{0.8, 0.95}));
  EXPECT_EQ(d.at("param_groups.0.params").to_vector<int64_t>(), (std::vector<int64_t>{0, 1}));

  const std::string path = temp_path("adam.safetensors");
  save(path, adam);
  nn::Linear lin2(3, 2);
  optim::Adam fresh(lin2.parameters());
  load(path, fresh);
  EXPECT_EQ(fresh.step_count(0), 3);
  EXPECT_EQ(fresh.options().beta1, 0.8);
  EXPECT_EQ(fresh.options().weight_decay, 0.1);
  EXPECT_TRUE(same_bits(fresh.exp_avg_sq(1), adam.exp_avg_sq(1)));
  expect_same_bits(fresh.state_dict(), d);

  // A moment of the wrong shape: raises naming it, and changes nothing.
  StateDict bad = snapshot(d);
  bad.insert("param_groups.0.lr", scalar_tensor(5.0, kFloat64));
  bad.insert("state.1.exp_avg", zeros({5}));
  nn::Linear lin3(3, 2);
  optim::Adam other(lin3.parameters());
  expect_error([&] { other.load_state_dict(bad); }, {"Adam", "state.1.exp_avg", "[5]", "[2]"});
  EXPECT_EQ(other.options().lr, 1e-3);
  EXPECT_EQ(other.step_count(0), 0);
  StateDict out_of_range = snapshot(d);
  out_of_range.insert("state.7.exp_avg", zeros({2}));
  expect_error([&] { other.load_state_dict(out_of_range); }, {"state.7.exp_avg", "index"});
  std::remove(path.c_str());
}

TEST(OptimizerStateDict, SGDMomentumRoundTrip) {
  manual_seed(6);
  nn::Linear lin(3, 2);
  optim::SGD sgd(lin.parameters(), optim::SGDOptions{0.1, 0.9, 0.0, 0.0, true});
  sgd.zero_grad();
  lin.forward(randn({4, 3})).sum().backward();
  sgd.step();
  StateDict d = sgd.state_dict();
  EXPECT_TRUE(d.contains("state.0.momentum_buffer"));
  EXPECT_EQ(d.at("param_groups.0.nesterov").item<bool>(), true);
  nn::Linear lin2(3, 2);
  optim::SGD fresh(lin2.parameters(), optim::SGDOptions{});
  fresh.load_state_dict(d);
  EXPECT_TRUE(fresh.options().nesterov);
  EXPECT_EQ(fresh.options().momentum, 0.9);
  EXPECT_TRUE(same_bits(fresh.momentum_buffer(1), sgd.momentum_buffer(1)));
}

TEST(RngState, GetAndSetReproduceDraws) {
  manual_seed(7);
  randn({3});
  Tensor state = get_rng_state();
  Tensor a = rand({5});
  randn({11});
  set_rng_state(state);
  EXPECT_TRUE(same_bits(rand({5}), a));
  expect_error([&] { set_rng_state(zeros({3})); }, {"set_rng_state", "float32[3]"});
}

// ---------------------------------------------------------------- resume bit for bit

// An MLP with dropout (so that the generator's state matters), trained by Adam on fixed batches.
struct Run {
  std::shared_ptr<nn::Sequential> net;
  std::unique_ptr<optim::Adam> adam;
  Run() {
    manual_seed(21);
    net = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(6, 32), std::make_shared<nn::ReLU>(),
        std::make_shared<nn::Dropout>(0.3), std::make_shared<nn::Linear>(32, 3)});
    adam = std::make_unique<optim::Adam>(net->parameters(), optim::AdamOptions{1e-2});
  }
  Tensor step(const Tensor& x, const Tensor& y) {
    adam->zero_grad();
    Tensor loss = cross_entropy(net->forward(x), y);
    loss.backward();
    adam->step();
    return loss;
  }
};

struct Batches {
  std::vector<Tensor> x, y;
  explicit Batches(int n) {
    manual_seed(99);
    for (int i = 0; i < n; ++i) {
      x.push_back(randn({16, 6}));
      y.push_back(randint(0, 3, {16}));
    }
  }
};

StateDict with_prefix(const std::string& prefix, const StateDict& d, StateDict out = {}) {
  for (const auto& [k, v] : d) out.insert(prefix + k, v);
  return out;
}
StateDict under(const std::string& prefix, const StateDict& d) {
  StateDict out;
  for (const auto& [k, v] : d)
    if (k.rfind(prefix, 0) == 0) out.insert(k.substr(prefix.size()), v);
  return out;
}

void save_checkpoint(const std::string& path, const Run& run) {
  StateDict all = with_prefix("model.", run.net->state_dict());
  all = with_prefix("optim.", run.adam->state_dict(), std::move(all));
  all.insert("rng", get_rng_state());
  save(path, all);
}
void load_checkpoint(const std::string& path, Run& run, bool restore_rng = true) {
  StateDict all = load(path);
  run.net->load_state_dict(under("model.", all));
  run.adam->load_state_dict(under("optim.", all));
  if (restore_rng) set_rng_state(all.at("rng"));
}

// Losses of steps [0, n) of a straight run and of one interrupted after n/2 steps, saved, and
// continued from the file in new objects; `traced` runs the steps through jit::trace.
struct Resumed {
  std::vector<float> straight, resumed, without_rng;
  StateDict straight_params, resumed_params;
};

Resumed resume_experiment(int n, bool traced) {
  Batches data(n);
  auto run_steps = [&](Run& run, int from, int to, std::vector<float>& losses) {
    jit::Function f;
    if (traced)
      f = jit::trace(
          [&](const std::vector<Tensor>& in) {
            return std::vector<Tensor>{run.step(in[0], in[1])};
          },
          {data.x[0], data.y[0]});
    for (int i = from; i < to; ++i)
      losses.push_back(
          (traced ? f({data.x[i], data.y[i]})[0] : run.step(data.x[i], data.y[i])).item<float>());
  };
  Resumed r;
  const std::string path = temp_path(traced ? "resume_traced.safetensors" : "resume.safetensors");
  {
    Run run;
    manual_seed(5);
    run_steps(run, 0, n, r.straight);
    r.straight_params = snapshot(run.net->state_dict());
  }
  {
    Run run;
    manual_seed(5);
    run_steps(run, 0, n / 2, r.resumed);
    save_checkpoint(path, run);
    manual_seed(12345);  // what the process draws in between must not matter
    randn({100});
  }
  {
    Run fresh;  // its initialization draws from the generator: the checkpoint restores it after
    load_checkpoint(path, fresh);
    run_steps(fresh, n / 2, n, r.resumed);
    r.resumed_params = snapshot(fresh.net->state_dict());
  }
  {
    Run fresh;  // the control: without the generator's state, dropout draws other masks
    load_checkpoint(path, fresh, /*restore_rng=*/false);
    r.without_rng.assign(r.straight.begin(), r.straight.begin() + n / 2);
    run_steps(fresh, n / 2, n, r.without_rng);
  }
  std::remove(path.c_str());
  return r;
}

void expect_resumed_bit_for_bit(const Resumed& r, int n) {
  ASSERT_EQ(r.straight.size(), static_cast<size_t>(n));
  ASSERT_EQ(r.resumed.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    EXPECT_EQ(std::memcmp(&r.straight[i], &r.resumed[i], sizeof(float)), 0)
        << "step " << i << ": " << r.straight[i] << " vs " << r.resumed[i];
  expect_same_bits(r.resumed_params, r.straight_params);
  EXPECT_NE(r.without_rng, r.straight) << "dropout's masks did not depend on the generator";
}

TEST(Resume, EagerTrainingContinuesBitForBit) {
  expect_resumed_bit_for_bit(resume_experiment(8, false), 8);
}

TEST(Resume, TracedTrainingContinuesBitForBit) {
  expect_resumed_bit_for_bit(resume_experiment(8, true), 8);
}

}  // namespace
}  // namespace kiln
