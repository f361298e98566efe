// erase on the CPU: copy the batch, then fill each sample's boxes (cutout and random erasing).
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "common.h"
#include "cpu/cpu_utils.h"
#include "cpu/kept_memory.h"

namespace fastpipe {
namespace cpu {
namespace {

// Writes erase_fill's noise for len pixels of a row (counters counter, counter + 1, ...), at
// stride_w elements apart. The noise of a chunk goes to a buffer first, in a loop of 32-bit
// integer operations that vectorizes, then is converted and stored.
template <typename T>
struct NoiseRow {
  static FASTPIPE_ALWAYS_INLINE void run(T* row, int64_t stride_w, int64_t len, uint32_t seed,
                                         uint32_t counter) {
    T values[kChunk];
    for (int64_t j = 0; j < len; j += kChunk) {
      const int64_t count = std::min(kChunk, len - j);
      const uint32_t first = counter + static_cast<uint32_t>(j);
      if constexpr (std::is_same_v<T, uint8_t>) {
        for (int64_t k = 0; k < count; ++k) {
          values[k] = noise_byte(seed, first + static_cast<uint32_t>(k));
        }
      } else {
        float noise[kChunk];
        for (int64_t k = 0; k < count; ++k) {
          noise[k] = noise_normal(seed, first + static_cast<uint32_t>(k));
        }
        store_floats(noise, values, count);
      }
      T* out = row + j * stride_w;
      if (stride_w == 1) {
        std::copy(values, values + count, out);
      } else {
        for (int64_t k = 0; k < count; ++k) {
          out[k * stride_w] = values[k];
        }
      }
    }
  }
};

// Consecutive rows of a box are a whole image row apart, a stride the hardware prefetcher does
// not follow: a store then waits for its cache line, one row at a time (docs/ops.md, "Prefetching
// the rows of a box"). Asking for the lines kPrefetchRows rows ahead keeps several rows in
// flight.
constexpr int64_t kPrefetchRows = 8;

template <typename T>
FASTPIPE_ALWAYS_INLINE void prefetch_for_write(const T* begin, const T* end) {
#if defined(__GNUC__) || defined(__clang__)
  constexpr uintptr_t kLine = 64;
  uintptr_t line = reinterpret_cast<uintptr_t>(begin) & ~(kLine - 1);
  const uintptr_t stop = reinterpret_cast<uintptr_t>(end);
  for (; line < stop; line += kLine) {
    __builtin_prefetch(reinterpret_cast<const void*>(line), 1, 3);
  }
#else
  (void)begin;
  (void)end;
#endif
}

// Writes the fill (or noise) into each sample's boxes of images, in place, through its strides.
// fill holds C values shared by every box, or C values per box ((N, K, C)); boxes are written in
// order, so where they overlap the later box's fill wins.
template <typename T>
void fill_boxes(at::Tensor& images, const at::Tensor& boxes, const at::Tensor& fill,
                const std::optional<at::Tensor>& seeds) {
  const Geometry g = geometry_of(images);
  const Strides s = strides_of(images);
  // Channels innermost when they are closest in memory (channels_last).
  const bool channels_inner = s.c < s.w;
  const int64_t count = boxes.size(1);
  const at::Tensor boxes_c = boxes.contiguous();
  const int64_t* all_boxes = boxes_c.const_data_ptr<int64_t>();
  const at::Tensor fill_c = fill.contiguous();
  const T* fill_values = fill_c.const_data_ptr<T>();
  const bool fill_per_box = fill.dim() == 3;
  at::Tensor seeds_c;
  if (seeds.has_value()) {
    seeds_c = seeds->contiguous();
  }
  const int64_t* seed_values = seeds.has_value() ? seeds_c.const_data_ptr<int64_t>() : nullptr;
  T* data = images.mutable_data_ptr<T>();

  // One sample per task: boxes of a sample may overlap, boxes of different samples never share
  // memory.
  at::parallel_for(0, g.n, sample_grain(g.c * g.h * g.w), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      T* sample = data + n * s.n;
      for (int64_t k = 0; k < count; ++k) {
        const int64_t* box = all_boxes + (n * count + k) * 4;
        const int64_t top = clamp_index(box[0], g.h), left = clamp_index(box[1], g.w);
        const int64_t bottom = clamp_index(box[2], g.h), right = clamp_index(box[3], g.w);
        if (bottom <= top || right <= left) {
          continue;
        }
        const T* box_fill = fill_per_box ? fill_values + (n * count + k) * g.c : fill_values;
        if (seed_values) {
          // erase_fill's noise, a row at a time: the counter of (c, y, x) is (c * H + y) * W + x.
          const uint32_t seed = static_cast<uint32_t>(seed_values[n]);
          for (int64_t c = 0; c < g.c; ++c) {
            for (int64_t y = top; y < bottom; ++y) {
              const uint32_t counter = static_cast<uint32_t>((c * g.h + y) * g.w + left);
              run_vectorized<NoiseRow<T>>(sample + c * s.c + y * s.h + left * s.w, s.w,
                                          right - left, seed, counter);
            }
          }
        } else if (channels_inner) {
          for (int64_t y = top; y < bottom; ++y) {
            for (int64_t x = left; x < right; ++x) {
              T* pixel = sample + y * s.h + x * s.w;
              for (int64_t c = 0; c < g.c; ++c) {
                pixel[c * s.c] = box_fill[c];
              }
            }
          }
        } else if (s.w == 1) {
          // The box's rows of every channel, in memory order, prefetching the row kPrefetchRows on.
          const int64_t rows = bottom - top, total = g.c * rows;
          auto row_at = [&](int64_t i) { return sample + (i / rows) * s.c + (top + i % rows) * s.h; };
          for (int64_t i = 0; i < std::min(kPrefetchRows, total); ++i) {
            prefetch_for_write(row_at(i) + left, row_at(i) + right);
          }
          for (int64_t i = 0; i < total; ++i) {
            if (i + kPrefetchRows < total) {
              T* ahead = row_at(i + kPrefetchRows);
              prefetch_for_write(ahead + left, ahead + right);
            }
            T* row = row_at(i);
            std::fill(row + left, row + right, box_fill[i / rows]);
          }
        } else {
          for (int64_t c = 0; c < g.c; ++c) {
            const T v = box_fill[c];
            for (int64_t y = top; y < bottom; ++y) {
              T* row = sample + c * s.c + y * s.h;
              for (int64_t x = left; x < right; ++x) {
                row[x * s.w] = v;
              }
            }
          }
        }
      }
    }
  });
}

// Functional erase with a constant fill of a batch dense in the output's layout, in one pass:
// each row is copied, then its boxes' segments are filled, in box order, while the row is still
// in cache.
template <typename T>
void erase_dense(const at::Tensor& images, at::Tensor& out, const at::Tensor& boxes,
                 const at::Tensor& fill, bool channels_last) {
  const Geometry g = geometry_of(images);
  const int64_t count = boxes.size(1);
  const at::Tensor boxes_c = boxes.contiguous();
  const int64_t* all_boxes = boxes_c.const_data_ptr<int64_t>();
  const at::Tensor fill_c = fill.contiguous();
  const T* fill_values = fill_c.const_data_ptr<T>();
  const bool fill_per_box = fill.dim() == 3;
  const int64_t row_length = channels_last ? g.w * g.c : g.w;
  const int64_t pixel = channels_last ? g.c : 1;
  const int64_t rows_per_sample = channels_last ? g.h : g.c * g.h;
  const T* in = images.const_data_ptr<T>();
  T* dst = out.mutable_data_ptr<T>();
  // channels_last: the fill repeated along a row, so that a box's segment is one copy.
  std::vector<T> fill_row(channels_last && !fill_per_box ? row_length : 0);
  for (int64_t j = 0; j < static_cast<int64_t>(fill_row.size()); ++j) {
    fill_row[j] = fill_values[j % g.c];
  }
  at::parallel_for(0, g.n * rows_per_sample, grain_for(row_length), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t n = row / rows_per_sample, r = row % rows_per_sample;
      const int64_t y = channels_last ? r : r % g.h;
      T* o = dst + row * row_length;
      std::copy(in + row * row_length, in + (row + 1) * row_length, o);
      for (int64_t k = 0; k < count; ++k) {
        const Segment box = box_segment(all_boxes + (n * count + k) * 4, g, y, pixel);
        if (box.empty()) {
          continue;
        }
        const T* box_fill = fill_per_box ? fill_values + (n * count + k) * g.c : fill_values;
        if (channels_last && fill_per_box) {
          // box.from and box.to are multiples of C: one pixel's C values at a time.
          for (int64_t j = box.from; j < box.to; j += g.c) {
            std::copy(box_fill, box_fill + g.c, o + j);
          }
        } else if (channels_last) {
          std::copy(fill_row.begin() + box.from, fill_row.begin() + box.to, o + box.from);
        } else {
          std::fill(o + box.from, o + box.to, box_fill[r / g.h]);
        }
      }
    }
  });
}

at::Tensor erase_cpu(const at::Tensor& images, const at::Tensor& boxes, const at::Tensor& fill,
                     const std::optional<at::Tensor>& seeds) {
  check_erase_args(images, boxes, fill, seeds);
  const auto format = output_format(images);
  at::Tensor out = empty_output(images.sizes(), images.scalar_type(), format);
  if (!seeds.has_value() && out.numel() > 0 && images.is_contiguous(format)) {
    with_image_type(images.scalar_type(), "erase", [&](auto tag) {
      erase_dense<decltype(tag)>(images, out, boxes, fill,
                                 format == at::MemoryFormat::ChannelsLast);
    });
    return out;
  }
  out.copy_(images);
  if (out.numel() == 0 || boxes.size(1) == 0) {
    return out;
  }
  with_image_type(images.scalar_type(), "erase", [&](auto tag) {
    fill_boxes<decltype(tag)>(out, boxes, fill, seeds);
  });
  return out;
}

void erase_inplace_cpu(at::Tensor& images, const at::Tensor& boxes, const at::Tensor& fill,
                       const std::optional<at::Tensor>& seeds) {
  check_erase_args(images, boxes, fill, seeds);
  check_writable(images, "erase_");
  if (images.numel() == 0 || boxes.size(1) == 0) {
    return;
  }
  with_image_type(images.scalar_type(), "erase_", [&](auto tag) {
    fill_boxes<decltype(tag)>(images, boxes, fill, seeds);
  });
}

}  // namespace
}  // namespace cpu
}  // namespace fastpipe

TORCH_LIBRARY_IMPL(fastpipe, CPU, m) {
  m.impl("erase", &fastpipe::cpu::erase_cpu);
  m.impl("erase_", &fastpipe::cpu::erase_inplace_cpu);
}
