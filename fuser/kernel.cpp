// The kernel description's text, cache key and symbol, and each instruction's level and stage.
#include "fuser/kernel.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

namespace kiln::fuser {

int32_t Kernel::add(Instr i) {
  if (i.prim == Prim::Exp && i.a >= 0) {
    const Instr& arg = body[static_cast<size_t>(i.a)];
    if (arg.prim == Prim::Sub && arg.b >= 0) {
      const Instr& max = body[static_cast<size_t>(arg.b)];
      if (max.prim == Prim::ReduceMax && max.a == arg.a) i.prim = Prim::ExpNonPos;
    }
  }
  body.push_back(i);
  return static_cast<int32_t>(body.size()) - 1;
}

std::string Kernel::str() const {
  std::ostringstream os;
  for (size_t i = 0; i < body.size(); ++i) {
    const Instr& in = body[i];
    os << "%" << i << " : " << dtype_name(in.type) << " = " << prim_name(in.prim);
    if (in.prim == Prim::Load || in.prim == Prim::Scalar) os << " " << in.index;
    if (in.per_row) os << " per-row";
    if (is_global_reduction(in)) os << " global " << in.index;
    if (is_column_reduction(in)) os << " column " << in.index << " part " << in.part;
    if (in.prim == Prim::Literal) os << " " << in.literal;
    for (int32_t o : {in.a, in.b, in.c})
      if (o >= 0) os << " %" << o;
    os << "\n";
  }
  os << "outputs:";
  for (int32_t o : outputs) os << " %" << o;
  return os.str();
}

std::string kernel_symbol(const std::string& key, const Kernel& k) {
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(key.data(), key.size())));
  return "kiln_" + k.ops + "_" + std::string(hash, 8);
}

std::string kernel_key(const Kernel& k, const Layout& layout) {
  std::string key;
  auto put = [&key](const void* p, size_t n) { key.append(static_cast<const char*>(p), n); };
  auto put_i = [&put](int64_t v) { put(&v, sizeof v); };
  // The ops' names too: they are part of the kernel's symbol.
  put_i(static_cast<int64_t>(k.ops.size()));
  key += k.ops;
  put_i(static_cast<int64_t>(k.input_types.size()));
  for (DType t : k.input_types) put_i(static_cast<int64_t>(t));
  put_i(static_cast<int64_t>(k.scalar_types.size()));
  for (DType t : k.scalar_types) put_i(static_cast<int64_t>(t));
  put_i(static_cast<int64_t>(k.body.size()));
  for (const Instr& in : k.body) {
    put_i(static_cast<int64_t>(in.prim));
    put_i(static_cast<int64_t>(in.type));
    put_i(in.a);
    put_i(in.b);
    put_i(in.c);
    put_i(in.index);
    put(&in.literal, sizeof in.literal);
    put_i(in.per_row);
    put_i(in.column);
    put_i(in.part);
  }
  put_i(static_cast<int64_t>(k.outputs.size()));
  for (int32_t o : k.outputs) put_i(o);
  for (DType t : k.output_types) put_i(static_cast<int64_t>(t));
  for (bool e : k.output_per_element) put_i(e);
  put_i(k.num_globals);
  put_i(k.num_columns());
  for (int32_t p : k.column_parts) put_i(p);
  put_i(layout.flat);
  put_i(layout.rows);
  put_i(layout.rank);
  put_i(static_cast<int64_t>(layout.single_element.size()));
  for (bool s : layout.single_element) put_i(s);
  put_i(static_cast<int64_t>(layout.by_value.size()));
  for (bool v : layout.by_value) put_i(v);
  put_i(static_cast<int64_t>(layout.inner.size()));
  for (Layout::Inner i : layout.inner) put_i(i);
  return key;
}

std::vector<Level> instr_levels(const Kernel& k) {
  std::vector<Level> level(k.body.size(), Level::kConst);
  for (size_t n = 0; n < k.body.size(); ++n) {
    const Instr& in = k.body[n];
    if (in.prim == Prim::Load) {
      level[n] = in.per_row ? Level::kRow : Level::kElement;
    } else if (in.prim == Prim::Scalar || in.prim == Prim::Literal) {
      level[n] = Level::kConst;
    } else if (is_reduction(in.prim)) {
      level[n] = is_column_reduction(in)   ? Level::kColumn
                 : is_global_reduction(in) ? Level::kGlobal
                                           : Level::kRow;
    } else {
      for (int32_t o : {in.a, in.b, in.c})
        if (o >= 0) level[n] = std::max(level[n], level[static_cast<size_t>(o)]);
    }
  }
  return level;
}

std::vector<int32_t> instr_stages(const Kernel& k) {
  std::vector<int32_t> stage(k.body.size(), 0);
  for (size_t n = 0; n < k.body.size(); ++n) {
    const Instr& in = k.body[n];
    for (int32_t o : {in.a, in.b, in.c})
      if (o >= 0) stage[n] = std::max(stage[n], stage[static_cast<size_t>(o)]);
    if (is_row_reduction(in)) ++stage[n];
  }
  return stage;
}

}  // namespace kiln::fuser
