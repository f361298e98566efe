// See kept_memory.h.
#include "cpu/kept_memory.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <pthread.h>

#include <memory>
#include <mutex>
#include <vector>

namespace fastpipe {
namespace cpu {
namespace {

struct Block {
  void* data;
  size_t bytes;
};

struct KeptBlocks {
  std::mutex mutex;
  std::vector<Block> blocks;  // oldest first
};

// Never destroyed: tensors may be freed during interpreter shutdown, after static destructors.
// The lock is held across fork(), so a child never inherits it locked by a thread it does not have.
KeptBlocks& kept() {
  static KeptBlocks* blocks = [] {
    auto* made = new KeptBlocks();
    pthread_atfork([] { kept().mutex.lock(); }, [] { kept().mutex.unlock(); },
                   [] { kept().mutex.unlock(); });
    return made;
  }();
  return *blocks;
}

void give_back(void* context) {
  const std::unique_ptr<Block> block(static_cast<Block*>(context));
  void* evicted = nullptr;
  {
    KeptBlocks& k = kept();
    std::lock_guard<std::mutex> lock(k.mutex);
    if (k.blocks.size() >= kKeptBlocks) {
      evicted = k.blocks.front().data;
      k.blocks.erase(k.blocks.begin());
    }
    k.blocks.push_back(*block);
  }
  if (evicted != nullptr) {
    c10::free_cpu(evicted);
  }
}

struct KeepFreedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t bytes) override {
    void* data = nullptr;
    {
      KeptBlocks& k = kept();
      std::lock_guard<std::mutex> lock(k.mutex);
      for (auto it = k.blocks.rbegin(); it != k.blocks.rend(); ++it) {
        if (it->bytes == bytes) {
          data = it->data;
          k.blocks.erase(std::next(it).base());
          break;
        }
      }
    }
    if (data == nullptr) {
      data = c10::alloc_cpu(bytes);
    }
    return {data, new Block{data, bytes}, &give_back, c10::Device(c10::DeviceType::CPU)};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

}  // namespace

at::Tensor empty_output(at::IntArrayRef sizes, at::ScalarType dtype, at::MemoryFormat format) {
  size_t bytes = c10::elementSize(dtype);
  for (int64_t side : sizes) bytes *= static_cast<size_t>(side);
  if (bytes < kKeptMinBytes) {
    return at::empty(sizes, at::TensorOptions().dtype(dtype), format);
  }
  static KeepFreedAllocator* allocator = new KeepFreedAllocator();
  return at::detail::empty_generic(sizes, allocator, c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   dtype, format);
}

}  // namespace cpu
}  // namespace fastpipe
