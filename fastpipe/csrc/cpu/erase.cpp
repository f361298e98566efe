// erase on the CPU: copy the batch, then fill each sample's boxes (cutout and random erasing).
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "common.h"
#include "cpu/cpu_utils.h"

namespace fastpipe {
namespace cpu {
namespace {

template <typename T>
void fill_boxes(at::Tensor& out, const at::Tensor& boxes, const at::Tensor& fill,
                const std::optional<at::Tensor>& seeds) {
  const Geometry g = geometry_of(out);
  const Strides s = strides_of(out);
  const bool channels_last = output_format(out) == at::MemoryFormat::ChannelsLast;
  const int64_t count = boxes.size(1);
  const at::Tensor boxes_c = boxes.contiguous();
  const int64_t* all_boxes = boxes_c.const_data_ptr<int64_t>();
  const at::Tensor fill_c = fill.contiguous();
  const T* fill_values = fill_c.const_data_ptr<T>();
  at::Tensor seeds_c;
  if (seeds.has_value()) {
    seeds_c = seeds->contiguous();
  }
  const int64_t* seed_values = seeds.has_value() ? seeds_c.const_data_ptr<int64_t>() : nullptr;
  T* dst = out.mutable_data_ptr<T>();

  // One sample per task: boxes of a sample may overlap, boxes of different samples never share
  // memory. A pixel covered twice gets the same value twice (the fill does not depend on the box).
  at::parallel_for(0, g.n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const uint32_t seed = seed_values ? static_cast<uint32_t>(seed_values[n]) : 0u;
      for (int64_t k = 0; k < count; ++k) {
        const int64_t* box = all_boxes + (n * count + k) * 4;
        const int64_t top = clamp_index(box[0], g.h), left = clamp_index(box[1], g.w);
        const int64_t bottom = clamp_index(box[2], g.h), right = clamp_index(box[3], g.w);
        if (bottom <= top || right <= left) {
          continue;
        }
        auto value = [&](int64_t c, int64_t y, int64_t x) -> T {
          if (!seed_values) {
            return fill_values[c];
          }
          return noise_value<T, HostConv>(seed, noise_counter(Index4{n, c, y, x}, g));
        };
        T* sample = dst + n * s.n;
        if (channels_last) {
          for (int64_t y = top; y < bottom; ++y) {
            for (int64_t x = left; x < right; ++x) {
              T* pixel = sample + y * s.h + x * s.w;
              for (int64_t c = 0; c < g.c; ++c) {
                pixel[c] = value(c, y, x);
              }
            }
          }
        } else {
          for (int64_t c = 0; c < g.c; ++c) {
            for (int64_t y = top; y < bottom; ++y) {
              T* row = sample + c * s.c + y * s.h;
              if (!seed_values) {
                const T v = fill_values[c];
                for (int64_t x = left; x < right; ++x) {
                  row[x] = v;
                }
              } else {
                for (int64_t x = left; x < right; ++x) {
                  row[x] = value(c, y, x);
                }
              }
            }
          }
        }
      }
    }
  });
}

at::Tensor erase_cpu(const at::Tensor& images, const at::Tensor& boxes, const at::Tensor& fill,
                     const std::optional<at::Tensor>& seeds) {
  check_erase_args(images, boxes, fill, seeds);
  at::Tensor out = at::empty(images.sizes(), images.options(), output_format(images));
  out.copy_(images);
  if (out.numel() == 0 || boxes.size(1) == 0) {
    return out;
  }
  with_image_type(images.scalar_type(), "erase", [&](auto tag) {
    fill_boxes<decltype(tag)>(out, boxes, fill, seeds);
  });
  return out;
}

}  // namespace
}  // namespace cpu
}  // namespace fastpipe

TORCH_LIBRARY_IMPL(fastpipe, CPU, m) {
  m.impl("erase", &fastpipe::cpu::erase_cpu);
}
