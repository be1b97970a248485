// Runs the MLP example's training (tools/examples/mlp_train.cpp) and checks that it learns the
// spiral: low loss and > 95% accuracy within a fixed number of steps.
#include <gtest/gtest.h>

#include <sstream>

#include "mlp_train.h"

namespace kiln::examples {
namespace {

TEST(MlpTrainExample, LearnsTheSpiral) {
  MlpTrainConfig config;
  // 500 x 64 activations stay under the parallel grain (32768 elements): the elementwise ops run
  // on one thread, so the test stays fast when other jobs occupy the cores.
  config.points_per_class = 250;
  config.steps = 400;
  config.seed = 7;
  std::ostringstream log;
  config.log = &log;
  config.log_every = 100;
  MlpTrainResult r = train_mlp(config);
  EXPECT_NEAR(r.initial_loss, 0.693, 0.15);  // about log 2 before training
  EXPECT_LT(r.final_loss, 0.15);
  EXPECT_GT(r.accuracy, 0.95);
  EXPECT_EQ(r.steps, 400);
  EXPECT_NE(log.str().find("step 400"), std::string::npos) << log.str();
  RecordProperty("train_seconds", std::to_string(r.seconds));
  std::cout << "mlp_train: loss " << r.initial_loss << " -> " << r.final_loss << ", accuracy "
            << r.accuracy << ", " << r.seconds << " s\n";
}

// The same seed reproduces the same run.
TEST(MlpTrainExample, IsDeterministic) {
  MlpTrainConfig config;
  config.points_per_class = 50;
  config.steps = 20;
  MlpTrainResult a = train_mlp(config), b = train_mlp(config);
  EXPECT_EQ(a.final_loss, b.final_loss);
  EXPECT_EQ(a.accuracy, b.accuracy);
}

}  // namespace
}  // namespace kiln::examples
