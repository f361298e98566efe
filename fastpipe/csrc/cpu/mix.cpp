// mixup and cutmix on the CPU: each sample n is mixed with sample N - 1 - n (the flipped batch).
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>

#include "common.h"
#include "cpu/cpu_utils.h"
#include "cpu/kept_memory.h"

namespace fastpipe {
namespace cpu {
namespace {

// o = mix(a, b) over len values, through float buffers so that each step vectorizes.
template <typename T>
struct MixRun {
  static FASTPIPE_ALWAYS_INLINE void run(const T* a, const T* b, T* o, int64_t len, float l) {
    float fa[kChunk], fb[kChunk];
    for (int64_t j = 0; j < len; j += kChunk) {
      const int64_t count = std::min(kChunk, len - j);
      load_floats(a + j, fa, count);
      load_floats(b + j, fb, count);
      for (int64_t k = 0; k < count; ++k) {
        fa[k] = mix_value(fa[k], fb[k], l);
      }
      store_floats(fa, o + j, count);
    }
  }
};

// The pair (a, b) mixed in place over len values: a <- mix(a, b, la), b <- mix(b, a, lb). With
// a == b (the middle sample of an odd batch) both stores write the same values.
template <typename T>
struct MixPairRun {
  static FASTPIPE_ALWAYS_INLINE void run(T* a, T* b, int64_t len, float la, float lb) {
    float fa[kChunk], fb[kChunk], oa[kChunk];
    for (int64_t j = 0; j < len; j += kChunk) {
      const int64_t count = std::min(kChunk, len - j);
      load_floats(a + j, fa, count);
      load_floats(b + j, fb, count);
      for (int64_t k = 0; k < count; ++k) {
        const float x = fa[k], y = fb[k];
        oa[k] = mix_value(x, y, la);
        fb[k] = mix_value(y, x, lb);
      }
      store_floats(oa, a + j, count);
      store_floats(fb, b + j, count);
    }
  }
};

at::Tensor mixup_cpu(const at::Tensor& images, const at::Tensor& lam) {
  check_mixup_args(images, lam);
  const auto format = output_format(images);
  at::Tensor out = empty_output(images.sizes(), images.scalar_type(), format);
  if (out.numel() == 0) {
    return out;
  }
  // In a dense NCHW or NHWC tensor each sample is one contiguous block, so sample n mixes with
  // sample N - 1 - n element by element, whatever the layout.
  const at::Tensor src = images.contiguous(format);
  const at::Tensor lam_c = lam.contiguous();
  const float* lam_values = lam_c.const_data_ptr<float>();
  const int64_t batch = images.size(0);
  const int64_t sample_size = out.numel() / batch;
  with_image_type(images.scalar_type(), "mixup", [&](auto tag) {
    using T = decltype(tag);
    const T* in = src.const_data_ptr<T>();
    T* dst = out.mutable_data_ptr<T>();
    at::parallel_for(0, out.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
      while (begin < end) {
        const int64_t n = begin / sample_size;
        const int64_t stop = std::min(end, (n + 1) * sample_size);
        const float l = lam_values[n];
        const T* a = in + begin;
        const T* b = in + mix_partner(n, batch) * sample_size + (begin - n * sample_size);
        T* o = dst + begin;
        run_vectorized<MixRun<T>>(a, b, o, stop - begin, l);
        begin = stop;
      }
    });
  });
  return out;
}

// cutmix of a batch dense in the output's layout, in one pass: each output row is copied from
// the sample itself, with the box's part of the row from the partner sample.
template <typename T>
void cutmix_dense(const at::Tensor& images, at::Tensor& out, const int64_t* all_boxes,
                  bool channels_last) {
  const Geometry g = geometry_of(images);
  const int64_t row_length = channels_last ? g.w * g.c : g.w;
  const int64_t pixel = channels_last ? g.c : 1;
  const int64_t rows_per_sample = channels_last ? g.h : g.c * g.h;
  const T* in = images.const_data_ptr<T>();
  T* dst = out.mutable_data_ptr<T>();
  at::parallel_for(0, g.n * rows_per_sample, grain_for(row_length), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t n = row / rows_per_sample, r = row % rows_per_sample;
      const int64_t y = channels_last ? r : r % g.h;
      const Segment box = box_segment(all_boxes + n * 4, g, y, pixel);
      const T* own = in + row * row_length;
      T* o = dst + row * row_length;
      if (!box.empty()) {
        const T* other = in + (mix_partner(n, g.n) * rows_per_sample + r) * row_length;
        std::copy(own, own + box.from, o);
        std::copy(other + box.from, other + box.to, o + box.from);
        std::copy(own + box.to, own + row_length, o + box.to);
      } else {
        std::copy(own, own + row_length, o);
      }
    }
  });
}

at::Tensor cutmix_cpu(const at::Tensor& images, const at::Tensor& boxes) {
  check_cutmix_args(images, boxes);
  const auto format = output_format(images);
  at::Tensor out = empty_output(images.sizes(), images.scalar_type(), format);
  if (out.numel() == 0) {
    return out;
  }
  if (images.is_contiguous(format)) {
    const at::Tensor boxes_c = boxes.contiguous();
    with_image_type(images.scalar_type(), "cutmix", [&](auto tag) {
      cutmix_dense<decltype(tag)>(images, out, boxes_c.const_data_ptr<int64_t>(),
                                  format == at::MemoryFormat::ChannelsLast);
    });
    return out;
  }
  // Any other layout: copy into the output's layout, then copy the boxes over.
  out.copy_(images);
  // Boxes are read from an unmodified source, since sample n's box overwrites part of sample n
  // while sample N - 1 - n still needs it.
  const at::Tensor src = images.is_contiguous(format) ? images : out.clone(format);
  const at::Tensor boxes_c = boxes.contiguous();
  const int64_t* all_boxes = boxes_c.const_data_ptr<int64_t>();
  const Geometry g = geometry_of(out);
  const Strides s = strides_of(out);
  const bool channels_last = format == at::MemoryFormat::ChannelsLast;
  with_image_type(images.scalar_type(), "cutmix", [&](auto tag) {
    using T = decltype(tag);
    const T* in = src.const_data_ptr<T>();
    T* dst = out.mutable_data_ptr<T>();
    at::parallel_for(0, g.n, sample_grain(g.c * g.h * g.w), [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        const int64_t* box = all_boxes + n * 4;
        const int64_t top = clamp_index(box[0], g.h), left = clamp_index(box[1], g.w);
        const int64_t bottom = clamp_index(box[2], g.h), right = clamp_index(box[3], g.w);
        if (bottom <= top || right <= left) {
          continue;
        }
        const T* from = in + mix_partner(n, g.n) * s.n;
        T* to = dst + n * s.n;
        if (channels_last) {
          // A box row is one run of (right - left) * C values.
          for (int64_t y = top; y < bottom; ++y) {
            const int64_t offset = y * s.h + left * s.w;
            std::copy(from + offset, from + offset + (right - left) * g.c, to + offset);
          }
        } else {
          for (int64_t c = 0; c < g.c; ++c) {
            for (int64_t y = top; y < bottom; ++y) {
              const int64_t offset = c * s.c + y * s.h + left;
              std::copy(from + offset, from + offset + (right - left), to + offset);
            }
          }
        }
      }
    });
  });
  return out;
}

void mixup_inplace_cpu(at::Tensor& images, const at::Tensor& lam) {
  check_mixup_args(images, lam);
  check_writable(images, "mixup_");
  if (images.numel() == 0) {
    return;
  }
  const auto format = output_format(images);
  if (!images.is_contiguous(format)) {
    // Sliced or permuted batches: compute the result, then write it back.
    images.copy_(mixup_cpu(images, lam));
    return;
  }
  // Dense NCHW or NHWC: each sample is one contiguous block; one pass over the first half of the
  // batch mixes each pair of blocks element by element.
  const at::Tensor lam_c = lam.contiguous();
  const float* lam_values = lam_c.const_data_ptr<float>();
  const int64_t batch = images.size(0);
  const int64_t sample_size = images.numel() / batch;
  const int64_t pairs = (batch + 1) / 2;
  with_image_type(images.scalar_type(), "mixup_", [&](auto tag) {
    using T = decltype(tag);
    T* data = images.mutable_data_ptr<T>();
    at::parallel_for(0, pairs * sample_size, 1 << 15, [&](int64_t begin, int64_t end) {
      while (begin < end) {
        const int64_t n = begin / sample_size, m = mix_partner(n, batch);
        const int64_t stop = std::min(end, (n + 1) * sample_size);
        const int64_t offset = begin - n * sample_size;
        run_vectorized<MixPairRun<T>>(data + n * sample_size + offset,
                                      data + m * sample_size + offset, stop - begin,
                                      lam_values[n], lam_values[m]);
        begin = stop;
      }
    });
  });
}

// cutmix in place on a batch dense in its layout: for each row of the first half of the batch,
// the row of the partner sample is visited too, and only the boxes' segments are written. Equal
// boxes (timm's batch mode, one box for the batch) swap their segments.
template <typename T>
void cutmix_inplace_dense(at::Tensor& images, const int64_t* all_boxes, bool channels_last) {
  const Geometry g = geometry_of(images);
  const int64_t row_length = channels_last ? g.w * g.c : g.w;
  const int64_t pixel = channels_last ? g.c : 1;
  const int64_t rows_per_sample = channels_last ? g.h : g.c * g.h;
  const int64_t pairs = (g.n + 1) / 2;
  T* data = images.mutable_data_ptr<T>();
  at::parallel_for(0, pairs * rows_per_sample, grain_for(row_length), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t n = row / rows_per_sample, r = row % rows_per_sample;
      const int64_t m = mix_partner(n, g.n);
      if (m == n) {
        continue;  // the middle sample's box comes from itself
      }
      const int64_t y = channels_last ? r : r % g.h;
      const Segment own = box_segment(all_boxes + n * 4, g, y, pixel);
      const Segment other = box_segment(all_boxes + m * 4, g, y, pixel);
      if (own.empty() && other.empty()) {
        continue;
      }
      T* row_n = data + row * row_length;
      T* row_m = data + (m * rows_per_sample + r) * row_length;
      if (own.from == other.from && own.to == other.to) {
        std::swap_ranges(row_n + own.from, row_n + own.to, row_m + own.from);
        continue;
      }
      const int64_t lo = own.empty() ? other.from : other.empty() ? own.from : std::min(own.from, other.from);
      const int64_t hi = std::max(own.to, other.to);
      for (int64_t x = lo; x < hi; ++x) {
        const T a = row_n[x], b = row_m[x];
        if (x >= own.from && x < own.to) {
          row_n[x] = b;
        }
        if (x >= other.from && x < other.to) {
          row_m[x] = a;
        }
      }
    }
  });
}

void cutmix_inplace_cpu(at::Tensor& images, const at::Tensor& boxes) {
  check_cutmix_args(images, boxes);
  check_writable(images, "cutmix_");
  if (images.numel() == 0) {
    return;
  }
  const auto format = output_format(images);
  if (!images.is_contiguous(format)) {
    images.copy_(cutmix_cpu(images, boxes));
    return;
  }
  const at::Tensor boxes_c = boxes.contiguous();
  with_image_type(images.scalar_type(), "cutmix_", [&](auto tag) {
    cutmix_inplace_dense<decltype(tag)>(images, boxes_c.const_data_ptr<int64_t>(),
                                        format == at::MemoryFormat::ChannelsLast);
  });
}

}  // namespace
}  // namespace cpu
}  // namespace fastpipe

TORCH_LIBRARY_IMPL(fastpipe, CPU, m) {
  m.impl("mixup", &fastpipe::cpu::mixup_cpu);
  m.impl("cutmix", &fastpipe::cpu::cutmix_cpu);
  m.impl("mixup_", &fastpipe::cpu::mixup_inplace_cpu);
  m.impl("cutmix_", &fastpipe::cpu::cutmix_inplace_cpu);
}
