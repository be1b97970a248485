// operator<< for tensors, in torch's format: tensor([[ 1.0000, -2.5000], ...], dtype=float64).
#include <cmath>
#include <cstdio>
#include <string>

#include "kiln/ops.h"
#include "lib/tensor_impl.h"

namespace kiln {

namespace {
constexpr int64_t kSummarizeAbove = 1000;  // elements; larger tensors print 3 items per edge
constexpr int64_t kEdgeItems = 3;

struct Formatter {
  DType dtype;
  bool int_mode = false;  // floats that are all whole numbers print as "3."
  bool sci_mode = false;
  int width = 1;

  std::string format(double v) const {
    char buf[64];
    if (dtype == kBool) return v != 0 ? "True" : "False";
    if (is_integral(dtype)) {
      std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
    } else if (std::isnan(v)) {
      return "nan";
    } else if (std::isinf(v)) {
      return v > 0 ? "inf" : "-inf";
    } else if (sci_mode) {
      std::snprintf(buf, sizeof buf, "%.4e", v);
    } else if (int_mode) {
      std::snprintf(buf, sizeof buf, "%.0f.", v);
    } else {
      std::snprintf(buf, sizeof buf, "%.4f", v);
    }
    return buf;
  }
  std::string padded(double v) const {
    std::string s = format(v);
    return std::string(width > static_cast<int>(s.size()) ? width - s.size() : 0, ' ') + s;
  }
};

// Indices along one dim that are shown: all, or the first and last kEdgeItems.
std::vector<int64_t> shown(int64_t n, bool summarize) {
  std::vector<int64_t> idx;
  if (!summarize || n <= 2 * kEdgeItems) {
    for (int64_t i = 0; i < n; ++i) idx.push_back(i);
  } else {
    for (int64_t i = 0; i < kEdgeItems; ++i) idx.push_back(i);
    idx.push_back(-1);  // the "..." marker
    for (int64_t i = n - kEdgeItems; i < n; ++i) idx.push_back(i);
  }
  return idx;
}

// Walks the shown elements without recursion: an explicit stack of (dim, position) frames.
void print_body(std::ostream& os, const Tensor& t, const Formatter& f, bool summarize, int indent) {
  const int64_t nd = t.dim();
  const double* data = t.data_ptr<double>();
  const Shape& st = t.strides();
  std::vector<std::vector<int64_t>> lists(nd);
  for (int64_t d = 0; d < nd; ++d) lists[d] = shown(t.sizes()[d], summarize);
  std::vector<size_t> pos(nd, 0);
  std::vector<int64_t> offset(nd + 1, 0);
  int64_t d = 0;
  os << '[';
  while (d >= 0) {
    if (pos[d] == lists[d].size()) {  // close this dim
      os << ']';
      pos[d] = 0;
      if (--d < 0) break;
      ++pos[d];
      if (pos[d] < lists[d].size()) {
        os << ',' << std::string(nd - d - 1, '\n') << std::string(indent + d + 1, ' ');
      }
      continue;
    }
    int64_t i = lists[d][pos[d]];
    if (i < 0) {  // summarized gap
      os << "...";
      ++pos[d];
      if (d == nd - 1) os << ", ";
      else os << ',' << std::string(nd - d - 1, '\n') << std::string(indent + d + 1, ' ');
      continue;
    }
    offset[d + 1] = offset[d] + i * st[d];
    if (d == nd - 1) {
      os << f.padded(data[offset[d + 1]]);
      if (++pos[d] < lists[d].size()) os << ", ";
    } else {
      ++d;
      os << '[';
    }
  }
}
}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "[ undefined tensor ]";
  const bool summarize = t.numel() > kSummarizeAbove;
  Tensor values = t.to(kFloat64);
  Formatter f{t.dtype()};
  if (is_floating_point(t.dtype()) && t.numel() > 0) {
    std::vector<double> v = values.to_vector<double>();
    double max_abs = 0, min_abs = INFINITY;
    bool whole = true;
    for (double x : v) {
      if (!std::isfinite(x)) continue;
      whole &= x == std::nearbyint(x);
      double a = std::fabs(x);
      max_abs = std::max(max_abs, a);
      if (a > 0) min_abs = std::min(min_abs, a);
    }
    f.int_mode = whole;
    f.sci_mode = whole ? max_abs >= 1e8 : (max_abs >= 1e8 || min_abs < 1e-4 || max_abs / min_abs > 1000);
    if (f.sci_mode) f.int_mode = false;
  }
  if (t.numel() > 0) {
    std::vector<double> v = values.to_vector<double>();
    for (double x : v) f.width = std::max<int>(f.width, static_cast<int>(f.format(x).size()));
  }
  os << "tensor(";
  if (t.dim() == 0) {
    os << f.format(values.item<double>());
  } else if (t.numel() == 0) {
    os << "[]";
  } else {
    print_body(os, values, f, summarize, 7);
  }
  if (t.numel() == 0 && t.dim() != 1) os << ", size=" << detail::shape_str(t.sizes());
  if (t.dtype() != kFloat32 && t.dtype() != kInt64 && t.dtype() != kBool)
    os << ", dtype=" << t.dtype();
  return os << ')';
}

}  // namespace kiln
