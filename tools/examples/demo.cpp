// The kiln demo: a tour of the eager API (tensors, broadcasting, views, reductions, GEMM, NN ops,
// errors), then autograd: a small two-layer network trained on random data with Adam.
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

  // The same network trained: backward() fills each parameter's grad(), Adam updates in place.
  std::vector<Tensor> params{w1, b1, w2, b2};
  for (Tensor& p : params) p.requires_grad_();
  optim::Adam adam(params, optim::AdamOptions{0.01});
  for (int step = 0; step <= 200; ++step) {  // loss and accuracy of the parameters before the step
    adam.zero_grad();
    Tensor out = linear(gelu(linear(x, w1, b1)), w2, b2);
    Tensor l = cross_entropy(out, target);
    l.backward();
    adam.step();
    if (step % 50 == 0) {
      NoGradGuard no_grad;
      Tensor acc = out.argmax(1).eq(target).to(kFloat32).mean();
      std::cout << "step " << step << ": loss " << l.item<float>() << ", accuracy "
                << acc.item<float>() << "\n";
    }
  }
  Tensor final_loss = cross_entropy(linear(gelu(linear(x, w1, b1)), w2, b2), target);
  std::cout << "the loss remembers its history: " << final_loss << "\n\n";

  try {
    Tensor bad = randn({2, 3}).matmul(randn({4, 5}));
  } catch (const Error& e) {
    std::cout << "a bad call raises kiln::Error: " << e.what() << "\n";
  }
  return 0;
}
