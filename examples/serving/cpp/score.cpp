// Load a dlrm bundle's model.pt2 in C++ and score one batch: AOTInductor's model package loader.
//
//   score BUNDLE_DIR/model.pt2 DENSE_WIDTH FEATURES [WEIGHTED]
//
// The inputs are the spec's `program.inputs`, in order (docs/serving.md): dense float32 [B, n], then
// per feature values int64 [N_f] and lengths int64 [B] (and weights float32 [N_f] for a weighted
// model). This example scores B = 4 rows, each with one id (0) per feature, and prints the
// probabilities ([B] or [B, T]). A server builds the same tensors from its rows as the spec says.
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/torch.h>

#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: score MODEL.pt2 DENSE_WIDTH FEATURES [WEIGHTED]\n";
    return 2;
  }
  const std::string package = argv[1];
  const int64_t dense_width = std::stoll(argv[2]);
  const int64_t features = std::stoll(argv[3]);
  const bool weighted = argc > 4 && std::string(argv[4]) == "1";
  const int64_t batch = 4;

  torch::NoGradGuard no_grad;
  // The package's one model ("model"): loaded once, then run from any number of requests.
  torch::inductor::AOTIModelPackageLoader loader(package);

  std::vector<torch::Tensor> inputs;
  inputs.push_back(torch::zeros({batch, dense_width}, torch::kFloat32));
  for (int64_t f = 0; f < features; ++f) {
    inputs.push_back(torch::zeros({batch}, torch::kInt64));  // values: one id (0) per row
    inputs.push_back(torch::ones({batch}, torch::kInt64));   // lengths
    if (weighted) inputs.push_back(torch::ones({batch}, torch::kFloat32));  // weights
  }
  std::vector<torch::Tensor> outputs = loader.run(inputs);
  std::cout << outputs[0] << "\n";
  return 0;
}
