// Uses the installed kiln package the way a user project would; exits non-zero on a wrong answer.
#include <kiln/kiln.h>

#include <iostream>

int main() {
  kiln::Tensor a = kiln::arange(6, kiln::kFloat32).reshape({2, 3});
  kiln::Tensor b = kiln::ones({3, 2});
  kiln::Tensor c = a.matmul(b).sum();  // every row of a summed twice: 2 * (0 + ... + 5)
  std::cout << "consumer: " << c << "\n";
  return c.item<float>() == 30.0f ? 0 : 1;
}
