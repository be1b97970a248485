// The kiln demo: a tour of the eager API (tensors, broadcasting, views, reductions, GEMM, NN ops,
// errors) ending with a small two-layer network's forward pass and loss.
#include <kiln/kiln.h>

#include <iostream>

int main() {
  using namespace kiln;
  manual_seed(0);
  std::cout << "kiln demo (" << get_num_threads() << " threads, CUDA "
            << (cuda::is_available() ? "available" : "not available") << ")\n\n";

  Tensor a = arange(6, kFloat32).reshape({2, 3});
  Tensor b = from_vector(std::vector<float>{10, 20, 30});
  std::cout << "a =\n" << a << "\n\na + b (broadcast) =\n" << a + b << "\n\n";
  std::cout << "a.t() (a view sharing a's storage) =\n" << a.t() << "\n\n";
  std::cout << "a.sum({1}, true) =\n" << a.sum({1}, true) << "\n\n";
  std::cout << "a.matmul(a.t()) =\n" << a.matmul(a.t()) << "\n\n";
  std::cout << "softmax(a, 1) =\n" << softmax(a, 1) << "\n\n";

  // A two-layer perceptron on random data: 64 samples, 16 features, 4 classes.
  Tensor x = randn({64, 16});
  Tensor w1 = randn({32, 16}) * 0.25, b1 = zeros({32});
  Tensor w2 = randn({4, 32}) * 0.18, b2 = zeros({4});
  Tensor target = randint(4, {64});
  Tensor hidden = gelu(linear(x, w1, b1));
  Tensor logits = linear(hidden, w2, b2);
  Tensor loss = cross_entropy(logits, target);
  Tensor accuracy = logits.argmax(1).eq(target).to(kFloat32).mean();
  std::cout << "MLP on random data: loss " << loss.item<float>()
            << " (chance level ~ log 4 = 1.386)"
            << ", accuracy " << accuracy.item<float>() << "\n\n";

  try {
    Tensor bad = randn({2, 3}).matmul(randn({4, 5}));
  } catch (const Error& e) {
    std::cout << "a bad call raises kiln::Error: " << e.what() << "\n";
  }
  return 0;
}
