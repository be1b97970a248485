// Eager-kernel benchmarks. The same run first measures this machine's limits (a STREAM-style triad
// for memory bandwidth, oneDNN's sgemm on a large square for GEMM throughput), then prints every
// figure as a fraction of its limit in a table after Google Benchmark's own output.
#include <benchmark/benchmark.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include "tools/bench/counters.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace {

using kiln::Tensor;

constexpr int64_t k16M = 16 * 1024 * 1024;

// --- limits
// a = b + s * c over arrays of n floats each, on every thread.
void triad(benchmark::State& state, int64_t n) {
  std::vector<float> a(n), b(n), c(n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) b[i] = 1.0f, c[i] = 2.0f;
  const float s = 3.0f;
  for (auto _ : state) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  state.counters["bytes/s"] =
      benchmark::Counter(3.0 * n * sizeof(float), benchmark::Counter::kIsIterationInvariantRate);
}

// DRAM bandwidth: each array at least as large as the last-level cache (this Xeon reports 480 MiB).
void BM_Limit_TriadBandwidth(benchmark::State& state) {
  long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  int64_t n = std::max<int64_t>(int64_t{32} << 20, l3 > 0 ? l3 / 4 : 0);
  triad(state, n);
}

// The same triad over 16M-element arrays, the working-set size of the elementwise benchmarks
// (which may fit in a large last-level cache): the limit those figures are compared with.
void BM_Limit_Triad16M(benchmark::State& state) {
  triad(state, k16M);
}

void BM_Limit_GemmPeak(benchmark::State& state) {
  const int64_t n = 2048;
  std::vector<float> a(n * n, 1.0f), b(n * n, 0.5f), c(n * n);
  for (auto _ : state) {
    dnnl_sgemm('N', 'N', n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["flop/s"] =
      benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate);
}

// --- kiln eager figures
using kiln::bench::set_bytes;
using kiln::bench::set_flops;

void BM_Add16M(benchmark::State& state) {
  Tensor a = kiln::randn({k16M}), b = kiln::randn({k16M});
  for (auto _ : state) benchmark::DoNotOptimize((a + b).raw_data_ptr());
  set_bytes(state, 3.0 * k16M * 4);  // read a and b, write the sum
}

void BM_GeluFromPrimitives16M(benchmark::State& state) {
  // Written from primitives as a user would: each op is its own pass in eager mode. Bytes counted
  // are the minimum (read x, write y), i.e. what one fused kernel would move.
  Tensor x = kiln::randn({k16M});
  for (auto _ : state) {
    Tensor y = x * 0.5 * (1.0 + kiln::erf(x * 0.7071067811865476));
    benchmark::DoNotOptimize(y.raw_data_ptr());
  }
  set_bytes(state, 2.0 * k16M * 4);
}

void BM_Softmax4096(benchmark::State& state) {
  Tensor x = kiln::randn({4096, 4096});
  for (auto _ : state) benchmark::DoNotOptimize(kiln::softmax(x, 1).raw_data_ptr());
  set_bytes(state, 2.0 * 4096 * 4096 * 4);
}

void BM_LayerNorm4096(benchmark::State& state) {
  Tensor x = kiln::randn({4096, 4096}), w = kiln::randn({4096}), b = kiln::randn({4096});
  for (auto _ : state) benchmark::DoNotOptimize(kiln::layer_norm(x, {4096}, w, b).raw_data_ptr());
  set_bytes(state, 2.0 * 4096 * 4096 * 4);
}

void BM_Mm1000(benchmark::State& state) {
  Tensor a = kiln::randn({1000, 1000}), b = kiln::randn({1000, 1000});
  for (auto _ : state) benchmark::DoNotOptimize(kiln::mm(a, b).raw_data_ptr());
  set_flops(state, 2.0 * 1000 * 1000 * 1000);
}

void BM_Addmm1000(benchmark::State& state) {
  Tensor bias = kiln::randn({1000}), a = kiln::randn({1000, 1000}), b = kiln::randn({1000, 1000});
  for (auto _ : state) benchmark::DoNotOptimize(kiln::addmm(bias, a, b).raw_data_ptr());
  set_flops(state, 2.0 * 1000 * 1000 * 1000 + 1000 * 1000);
}

BENCHMARK(BM_Limit_TriadBandwidth)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Limit_Triad16M)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Limit_GemmPeak)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Add16M)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_GeluFromPrimitives16M)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Softmax4096)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_LayerNorm4096)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Mm1000)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Addmm1000)->Unit(benchmark::kMillisecond)->UseRealTime();

// Prints Google Benchmark's usual table, then every figure against the limit measured in this run.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  RatioReporter() : ConsoleReporter(OO_None) {}

  // Keeps each benchmark's rates: from the median when repetitions are aggregated, else the run.
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      bool median = r.run_type == Run::RT_Aggregate && r.aggregate_name == "median";
      if (r.run_type != Run::RT_Iteration && !median) continue;
      for (const auto& [name, counter] : r.counters) rates_[r.run_name.str()][name] = counter.value;
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    double bw = rate("BM_Limit_TriadBandwidth", "bytes/s");
    double bw16 = rate("BM_Limit_Triad16M", "bytes/s");
    double peak = rate("BM_Limit_GemmPeak", "flop/s");
    std::printf(
        "\nlimits measured in this run: DRAM triad %.2f GB/s, 16M-element triad %.2f GB/s, "
        "sgemm 2048^3 %.1f GFLOP/s\n",
        bw / 1e9, bw16 / 1e9, peak / 1e9);
    std::printf("%-28s %16s %14s %14s\n", "figure", "measured", "/ DRAM triad", "/ 16M triad");
    for (const auto& [bench, counters] : rates_) {
      if (bench.rfind("BM_Limit", 0) == 0) continue;
      if (counters.count("bytes/s") && bw > 0 && bw16 > 0) {
        double v = counters.at("bytes/s");
        std::printf("%-28s %11.2f GB/s %14.3f %14.3f\n", bench.c_str(), v / 1e9, v / bw, v / bw16);
      } else if (counters.count("flop/s") && peak > 0) {
        double v = counters.at("flop/s");
        std::printf("%-28s %8.1f GFLOP/s %14s %14s   / sgemm peak %.3f\n", bench.c_str(), v / 1e9,
                    "", "", v / peak);
      }
    }
    std::printf("(threads: %d)\n", omp_get_max_threads());
  }

 private:
  double rate(const std::string& bench, const std::string& counter) const {
    for (const auto& [name, counters] : rates_)
      if (name.rfind(bench, 0) == 0 && counters.count(counter)) return counters.at(counter);
    return 0;
  }
  std::map<std::string, std::map<std::string, double>> rates_;
};

}  // namespace

int kiln_bench_first_call_main();  // fuser_bench.cpp: BM_FuseNewProcess's child process

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--first-call") return kiln_bench_first_call_main();
  // The reference figures are eager kiln; benchmarks of lazy mode and traces set their mode.
  kiln::set_lazy_enabled(false);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
