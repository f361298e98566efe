// Random parameters computed on the CPU from uniforms drawn in Python: random erasing's boxes.
//
// The uniforms come from torch's generator (fastpipe/ops/_params.py), so a seed fixes them; this is
// only their geometry, the same float64 operations in the same order as the traced torch version
// in _params.erasing_boxes, in one call instead of ~50 small tensor ops, whose overhead is most of
// the geometry's cost (docs/ops.md, "Less Python per call").
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cfenv>
#include <cmath>

namespace fastpipe {
namespace cpu {
namespace {

// torchvision's and timm's RandomErasing make ten attempts at a box that fits.
constexpr int64_t kAttempts = 10;

at::Tensor erasing_boxes_cpu(const at::Tensor& uniforms, int64_t height, int64_t width,
                             int64_t max_count, double p, double scale_low, double scale_high,
                             double log_ratio_low, double log_ratio_high, int64_t min_count) {
  TORCH_CHECK(min_count >= 1 && min_count <= max_count,
              "fastpipe::erasing_boxes: need 1 <= min_count <= max_count, got min_count ",
              min_count, " and max_count ", max_count);
  const int64_t per_box = 2 * kAttempts + 2;
  TORCH_CHECK(uniforms.dim() == 2 && uniforms.size(1) == 2 + max_count * per_box &&
                  uniforms.scalar_type() == at::kDouble && uniforms.device().is_cpu(),
              "fastpipe::erasing_boxes: uniforms must be a CPU float64 (N, ", 2 + max_count * per_box,
              ") tensor, got ", uniforms.scalar_type(), " ", uniforms.sizes(), " on ",
              uniforms.device());
  const int64_t batch = uniforms.size(0);
  at::Tensor boxes = at::zeros({batch, max_count, 4}, uniforms.options().dtype(at::kLong));
  const at::Tensor u_c = uniforms.contiguous();
  const double* all_u = u_c.const_data_ptr<double>();
  int64_t* out = boxes.mutable_data_ptr<int64_t>();
  const double scale_span = scale_high - scale_low;
  const double log_span = log_ratio_high - log_ratio_low;
  const double limit_h = static_cast<double>(height), limit_w = static_cast<double>(width);
  const double image_area = static_cast<double>(height * width);
  // std::nearbyint rounds half to even in the default rounding mode, as torch.round does.
  TORCH_CHECK(std::fegetround() == FE_TONEAREST,
              "fastpipe::erasing_boxes: the floating-point rounding mode is not to-nearest");
  for (int64_t n = 0; n < batch; ++n) {
    const double* u = all_u + n * (2 + max_count * per_box);
    if (!(u[0] < p)) {
      continue;
    }
    // Uniform in min_count..max_count.
    const double count = std::floor(u[1] * static_cast<double>(max_count - min_count + 1)) +
                         static_cast<double>(min_count);
    const double area_per_box = image_area / count;
    for (int64_t k = 0; k < max_count; ++k) {
      if (!(static_cast<double>(k) < count)) {
        break;
      }
      const double* box_u = u + 2 + k * per_box;
      for (int64_t a = 0; a < kAttempts; ++a) {
        const double area = (box_u[a] * scale_span + scale_low) * area_per_box;
        const double log_ratio = box_u[kAttempts + a] * log_span + log_ratio_low;
        const double h = std::nearbyint(std::sqrt(area * std::exp(log_ratio)));
        const double w = std::nearbyint(std::sqrt(area * std::exp(-log_ratio)));
        if (!(h < limit_h && w < limit_w)) {
          continue;
        }
        // The top-left corner is uniform over the (H - h + 1) x (W - w + 1) positions that fit.
        const double slack_h = limit_h - h, slack_w = limit_w - w;
        const double top = std::min(std::floor(box_u[2 * kAttempts] * (slack_h + 1.0)), slack_h);
        const double left = std::min(std::floor(box_u[2 * kAttempts + 1] * (slack_w + 1.0)), slack_w);
        int64_t* box = out + (n * max_count + k) * 4;
        box[0] = static_cast<int64_t>(top);
        box[1] = static_cast<int64_t>(left);
        box[2] = static_cast<int64_t>(top + h);
        box[3] = static_cast<int64_t>(left + w);
        break;
      }
    }
  }
  return boxes;
}

}  // namespace
}  // namespace cpu
}  // namespace fastpipe

TORCH_LIBRARY_IMPL(fastpipe, CPU, m) {
  m.impl("erasing_boxes", &fastpipe::cpu::erasing_boxes_cpu);
}
