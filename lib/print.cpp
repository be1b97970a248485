// operator<< for tensors, in torch's format: tensor([[ 1.0000, -2.5000], ...], dtype=float64).
//
// This follows torch/_tensor_str.py: one formatter for the whole tensor, chosen from the elements
// that are shown (the first and last kEdgeItems along each dim when the tensor has more than
// kSummarizeAbove elements). For floats it looks only at the nonzero finite values: all whole
// numbers print as "3." (int mode), and a wide range (max/min > 1000), max > 1e8 or (outside int
// mode) min < 1e-4 switches to scientific notation. Every element is padded to the widest one, and
// rows wrap at kLineWidth columns.
#include <cmath>
#include <cstdio>
#include <string>

#include "kiln/autograd.h"
#include "kiln/ops.h"
#include "lib/tensor_impl.h"

namespace kiln {

namespace {
constexpr int64_t kSummarizeAbove = 1000;  // elements; larger tensors print 3 items per edge
constexpr int64_t kEdgeItems = 3;
constexpr int kLineWidth = 80;
constexpr int kPrecision = 4;

// One element: integers and bools are kept as int64 so that large values print exactly.
struct Value {
  double d = 0;
  int64_t i = 0;
};

struct Formatter {
  DType dtype;
  bool int_mode = true;  // floats that are all whole numbers print as "3."
  bool sci_mode = false;
  int width = 1;

  std::string format(const Value& v) const {
    char buf[64];
    if (dtype == kBool) return v.i != 0 ? "True" : "False";
    if (is_integral(dtype)) {
      std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v.i));
    } else if (std::isnan(v.d)) {
      return "nan";
    } else if (std::isinf(v.d)) {
      return v.d > 0 ? "inf" : "-inf";
    } else if (sci_mode) {
      std::snprintf(buf, sizeof buf, "%.*e", kPrecision, v.d);
    } else if (int_mode) {
      std::snprintf(buf, sizeof buf, "%.0f.", v.d);
    } else {
      std::snprintf(buf, sizeof buf, "%.*f", kPrecision, v.d);
    }
    return buf;
  }
  std::string padded(const Value& v) const {
    std::string s = format(v);
    return std::string(width > static_cast<int>(s.size()) ? width - s.size() : 0, ' ') + s;
  }

  // Chooses the mode and width from the shown values, as torch's _Formatter.
  void fit(const std::vector<Value>& shown) {
    if (!is_floating_point(dtype)) {
      for (const Value& v : shown) width = std::max<int>(width, static_cast<int>(format(v).size()));
      return;
    }
    double max_abs = 0, min_abs = INFINITY;
    bool any = false;
    for (const Value& v : shown) {
      if (!std::isfinite(v.d) || v.d == 0) continue;
      any = true;
      int_mode &= v.d == std::ceil(v.d);
      max_abs = std::max(max_abs, std::fabs(v.d));
      min_abs = std::min(min_abs, std::fabs(v.d));
    }
    if (!any) return;
    sci_mode = max_abs / min_abs > 1000.0 || max_abs > 1.0e8 || (!int_mode && min_abs < 1.0e-4);
    for (const Value& v : shown) {
      if (!std::isfinite(v.d) || v.d == 0) continue;
      width = std::max<int>(width, static_cast<int>(format(v).size()));
    }
  }
};

// Indices along one dim that are shown: all, or the first and last kEdgeItems around a -1 marker.
std::vector<int64_t> shown_indices(int64_t n, bool summarize) {
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

struct Printer {
  const Tensor& values;  // int64 or float64, same geometry as the printed tensor
  bool summarize;
  Formatter f;

  Value at(int64_t offset) const {
    Value v;
    if (values.dtype() == kInt64)
      v.i = values.data_ptr<int64_t>()[offset];
    else
      v.d = values.data_ptr<double>()[offset];
    return v;
  }

  // Every shown element in print order.
  void collect(int64_t d, int64_t offset, std::vector<Value>& out) const {
    if (d == values.dim()) return out.push_back(at(offset));
    for (int64_t i : shown_indices(values.size(d), summarize))
      if (i >= 0) collect(d + 1, offset + i * values.stride(d), out);
  }

  // The text of the sub-tensor at `offset` from dim d on, as torch's _tensor_str_with_formatter.
  void print(std::string& out, int64_t d, int64_t offset, int indent) const {
    const int64_t rest = values.dim() - d;
    const std::vector<int64_t> idx = shown_indices(values.size(d), summarize);
    out += '[';
    if (rest == 1) {
      const size_t per_line = std::max(1, (kLineWidth - indent) / (f.width + 2));
      for (size_t k = 0; k < idx.size(); ++k) {
        if (k > 0) out += k % per_line == 0 ? ",\n" + std::string(indent + 1, ' ') : ", ";
        out += idx[k] < 0 ? " ..." : f.padded(at(offset + idx[k] * values.stride(d)));
      }
    } else {
      for (size_t k = 0; k < idx.size(); ++k) {
        if (k > 0) out += ',' + std::string(rest - 1, '\n') + std::string(indent + 1, ' ');
        if (idx[k] < 0)
          out += "...";
        else
          print(out, d + 1, offset + idx[k] * values.stride(d), indent + 1);
      }
    }
    out += ']';
  }
};
}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "[ undefined tensor ]";
  detail::MaterializeCause cause("printing");
  const std::string prefix = "tensor(";
  std::vector<std::string> suffixes;
  if (!t.device().is_cpu()) suffixes.push_back("device='" + t.device().str() + "'");  // as torch
  std::string body;
  if (t.numel() == 0) {
    body = "[]";
    if (t.dim() != 1) {  // the shape as a Python tuple
      std::string s = "size=(";
      for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
      suffixes.push_back(s + ")");
    }
    // Nothing shows the dtype of an empty tensor, so only the default one goes unnamed.
    if (t.dtype() != kFloat32) suffixes.push_back(std::string("dtype=") + dtype_name(t.dtype()));
  } else {
    NoGradGuard no_history;  // printing is not part of the computation
    Tensor values = t.to(kCPU).to(is_floating_point(t.dtype()) ? kFloat64 : kInt64);
    Printer p{values, t.numel() > kSummarizeAbove, Formatter{t.dtype()}};
    std::vector<Value> shown;
    p.collect(0, 0, shown);
    p.f.fit(shown);
    if (t.dim() == 0)
      body = p.f.padded(shown[0]);
    else
      p.print(body, 0, 0, static_cast<int>(prefix.size()));
    if (t.dtype() != kFloat32 && t.dtype() != kInt64 && t.dtype() != kBool)
      suffixes.push_back(std::string("dtype=") + dtype_name(t.dtype()));
  }
  if (t.requires_grad())
    suffixes.push_back(t.is_leaf() ? std::string("requires_grad=True")
                                   : "grad_fn=<" + t.grad_fn_name() + ">");
  os << prefix << body;
  for (const std::string& s : suffixes) os << ", " << s;
  return os << ')';
}

}  // namespace kiln
