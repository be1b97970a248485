// The fusion decision (fuser/fusion_decision.h): why_not names the check that refuses a producer,
// with the values that explain it, and KILN_LOG=fuser prints one line per refused producer with
// that reason.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "fuser/fusion_decision.h"
#include "kiln/kiln.h"
#include "tests/fuser/fuser_testing.h"
#include "tests/jit/log_capture.h"
#include "tests/testing.h"

namespace kiln {
namespace {

using fuser::Reason;
using testing::Inputs;
using testing::plan_of;
using testing::Planned;

// The first node of `op` in the graph.
const jit::Node* node_of(const jit::Graph& g, const std::string& op) {
  for (const jit::Node* n = g.first(); n; n = n->next())
    if (n->op().name == op) return n;
  ADD_FAILURE() << "no " << op << " node in\n" << g.str();
  return nullptr;
}

std::vector<std::string> refusals_in(const std::string& log) {
  std::vector<std::string> lines;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);)
    if (line.find("not merged into the group at") != std::string::npos) lines.push_back(line);
  return lines;
}

// b = exp(a) + m + c: the group rooted at the last add takes exp, and refuses three producers,
// each for another reason: a (read by the GEMM before the group runs), the GEMM itself (not
// fusible) and c (broadcast into the group, but also returned).
Inputs three_refusals(const Inputs& in) {
  Tensor a = in[0] * 2.0;     // [6, 10]
  Tensor m = mm(a, in[1]);    // [6, 10]
  Tensor c = sin(in[2]);      // [10]
  Tensor b = exp(a) + m + c;  // [6, 10]
  return Inputs{b, c};
}

TEST(FusionDecision, LogPrintsTheReasonForEachRefusedMerge) {
  const Tensor x = testing::input({6, 10}), w = testing::input({10, 10}), y = testing::input({10});
  Planned p;
  const std::string log = testing::logged("fuser", [&] { p = plan_of(three_refusals, {x, w, y}); });
  const jit::Graph& g = *p.graph;
  const std::string root = fuser::node_label(*node_of(g, "add")->output()->uses()[0].user);
  const std::string mul = fuser::node_label(*node_of(g, "mul"));
  const std::string mm = fuser::node_label(*node_of(g, "mm"));
  const std::string sin = fuser::node_label(*node_of(g, "sin"));
  const std::string into = " not merged into the group at " + root + ": ";
  const std::vector<std::string> lines = refusals_in(log);
  const std::vector<std::string> want = {
      "[kiln fuser] " + mul + into + "it is also read by " + mm +
          ", outside the group and before the group's last node",
      "[kiln fuser] " + mm + into + "not fusible: a GEMM (a oneDNN library call)",
      "[kiln fuser] " + sin + into +
          "it broadcasts from [10] to the group's [6, 10] and would be recomputed per element, "
          "but it is a graph output",
  };
  for (const std::string& line : want)
    EXPECT_EQ(std::count(lines.begin(), lines.end(), line), 1) << line << "\nin\n" << log;
  EXPECT_EQ(lines.size(), want.size()) << log;
  // One kernel (exp, add, add); the refused producers run as steps of their own.
  EXPECT_EQ(p.plan->num_kernel_steps(), 1u) << g.str();
  const Inputs got = p.plan->run(p.binding.inputs);
  const Inputs want_values = testing::eager(three_refusals, {x, w, y});
  for (size_t i = 0; i < got.size(); ++i)
    testing::expect_bit_equal(got[i], want_values[i], "output " + std::to_string(i));
}

// The decision itself, on a group of the last add alone: each refused producer's Reason carries
// the kind of check and the node or shapes it names; an accepted one says how it joins.
TEST(FusionDecision, WhyNotNamesTheCheckAndItsValues) {
  const Tensor x = testing::input({6, 10}), w = testing::input({10, 10}), y = testing::input({10});
  Planned p = plan_of(three_refusals, {x, w, y});
  const jit::Graph& graph = *p.graph;
  const jit::Node* first_add = node_of(graph, "add");
  const jit::Node* root = first_add->output()->uses()[0].user;
  fuser::Grouping g(graph);
  fuser::Building group;
  group.members = {root};
  group.shape = {6, 10};
  ASSERT_EQ(fuser::start_group(g, group, fuser::Role::kElement), 0u);

  fuser::Merge merge;
  std::optional<Reason> why = fuser::why_not(g, 0, *node_of(graph, "sin"), merge);
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->kind, Reason::Kind::kBroadcastReadOutside);
  EXPECT_EQ(why->shape, Shape({10}));
  EXPECT_EQ(why->group_shape, Shape({6, 10}));
  EXPECT_EQ(why->node, nullptr);  // read by no other node: a graph output

  ASSERT_FALSE(fuser::why_not(g, 0, *first_add, merge).has_value());
  EXPECT_EQ(merge.role, fuser::Role::kElement);
  EXPECT_EQ(merge.shape, Shape({6, 10}));
  fuser::apply_merge(g, 0, *first_add, merge);

  why = fuser::why_not(g, 0, *node_of(graph, "mm"), merge);
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->kind, Reason::Kind::kNotFusible);
  EXPECT_EQ(why->node, node_of(graph, "mm"));

  ASSERT_FALSE(fuser::why_not(g, 0, *node_of(graph, "exp"), merge).has_value());
  fuser::apply_merge(g, 0, *node_of(graph, "exp"), merge);
  why = fuser::why_not(g, 0, *node_of(graph, "mul"), merge);
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->kind, Reason::Kind::kReadBefore);
  EXPECT_EQ(why->node, node_of(graph, "mm"));
}

TEST(FusionDecision, AFullGroupTakesNoProducer) {
  fuser::Building group;
  group.members.assign(fuser::kMaxGroupNodes - 1, nullptr);
  EXPECT_FALSE(fuser::why_not_full(group).has_value());
  group.members.push_back(nullptr);
  std::optional<Reason> why = fuser::why_not_full(group);
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->kind, Reason::Kind::kGroupFull);
  EXPECT_EQ(why->to_string(), "the group has reached 128 nodes (kernels stay quick to compile)");
}

}  // namespace
}  // namespace kiln
