// NVRTC wrapper: compiles CUDA C++ source to PTX or cubin and reports failures with the full log.
#include "fuser/codegen/cuda/nvrtc.h"

#include <nvrtc.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "kiln/error.h"

namespace kiln::fuser::cuda {

namespace {

void check(nvrtcResult r, const char* what, const std::string& name) {
  KILN_CHECK(r == NVRTC_SUCCESS, "NVRTC: ", what, " for ", name, ": ", nvrtcGetErrorString(r));
}

// Destroys the program on every path out of nvrtc_compile (errors throw).
struct ProgramDeleter {
  void operator()(nvrtcProgram* p) const {
    nvrtcDestroyProgram(p);
    delete p;
  }
};

std::string program_log(nvrtcProgram prog, const std::string& name) {
  size_t size = 0;
  check(nvrtcGetProgramLogSize(prog, &size), "reading the log size", name);
  std::string log(size, '\0');
  if (size > 0) check(nvrtcGetProgramLog(prog, log.data()), "reading the log", name);
  // The size counts the terminating NUL; a log with nothing to say is "" (or a lone newline).
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  return log;
}

}  // namespace

std::vector<int> nvrtc_supported_archs() {
  int n = 0;
  check(nvrtcGetNumSupportedArchs(&n), "counting the supported architectures", "NVRTC");
  std::vector<int> archs(static_cast<size_t>(n));
  if (n > 0) check(nvrtcGetSupportedArchs(archs.data()), "listing the architectures", "NVRTC");
  return archs;
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  check(nvrtcVersion(&major, &minor), "reading the version", "NVRTC");
  return "NVRTC " + std::to_string(major) + "." + std::to_string(minor);
}

CudaCompiled nvrtc_compile(const std::string& source, const std::string& name, int sm,
                           CudaOutput output, const std::vector<std::string>& options) {
  const std::vector<int> archs = nvrtc_supported_archs();
  KILN_CHECK(std::find(archs.begin(), archs.end(), sm) != archs.end(), "NVRTC: ", nvrtc_version(),
             " does not compile for sm_", sm, " (", name, ")");
  std::unique_ptr<nvrtcProgram, ProgramDeleter> prog(new nvrtcProgram(nullptr));
  check(nvrtcCreateProgram(prog.get(), source.c_str(), (name + ".cu").c_str(), 0, nullptr, nullptr),
        "creating the program", name);
  std::vector<std::string> args = {std::string("--gpu-architecture=") +
                                       (output == CudaOutput::kPtx ? "compute_" : "sm_") +
                                       std::to_string(sm),
                                   "-std=c++17"};
  args.insert(args.end(), options.begin(), options.end());
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  const nvrtcResult r = nvrtcCompileProgram(*prog, static_cast<int>(argv.size()), argv.data());
  CudaCompiled out;
  out.log = program_log(*prog, name);
  if (r != NVRTC_SUCCESS) {
    std::string flags;
    for (const std::string& a : args) flags += " " + a;
    KILN_CHECK(false, "NVRTC: compiling ", name, " failed (", nvrtcGetErrorString(r), ";", flags,
               "):\n", out.log);
  }
  size_t size = 0;
  if (output == CudaOutput::kPtx) {
    check(nvrtcGetPTXSize(*prog, &size), "reading the PTX size", name);
    out.code.resize(size);
    check(nvrtcGetPTX(*prog, out.code.data()), "reading the PTX", name);
    if (!out.code.empty() && out.code.back() == '\0') out.code.pop_back();
  } else {
    check(nvrtcGetCUBINSize(*prog, &size), "reading the cubin size", name);
    out.code.resize(size);
    check(nvrtcGetCUBIN(*prog, out.code.data()), "reading the cubin", name);
  }
  return out;
}

}  // namespace kiln::fuser::cuda
