// Large op outputs on the CPU, in memory kept from earlier outputs of the same size.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>

namespace fastpipe {
namespace cpu {

// Outputs of at least this many bytes are kept for reuse when freed.
constexpr size_t kKeptMinBytes = size_t{16} << 20;
// At most this many freed blocks are kept (the oldest is released first): a training loop holds
// one batch while the next is made.
constexpr size_t kKeptBlocks = 2;

// at::empty for the CPU kernels' outputs, except that an output of at least kKeptMinBytes reuses
// the memory of an earlier output of the same size once every tensor using it has been freed.
// glibc gives allocations above 32 MiB fresh pages from mmap and unmaps them on free, so a float
// batch would otherwise take one page fault per 4 KiB, every batch, which made normalize to
// float32 several times slower (docs/ops.md, "On the CPU, keep freed memory"). Memory is reused
// only after its last tensor is gone, as torch's CUDA caching allocator does on the GPU.
at::Tensor empty_output(at::IntArrayRef sizes, at::ScalarType dtype, at::MemoryFormat format);

}  // namespace cpu
}  // namespace fastpipe
