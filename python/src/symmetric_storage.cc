// python/src/symmetric_storage.cc: MoveStorageToSymmetric (symmetric_storage.h).
#include "symmetric_storage.h"

#include <cstring>

namespace mc2py {
namespace {

void FreeSymmetric(void* ctx) { delete static_cast<mc2::SymmetricBuffer*>(ctx); }

}  // namespace

bool MoveStorageToSymmetric(const mc2::Group& group, const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t bytes = s->nbytes();
  if (bytes == 0 || group.IsSymmetric(s->data(), bytes)) return bytes != 0;
  mc2::SymmetricBuffer buf;
  try {
    buf = group.AllocSymmetric(bytes);
  } catch (const mc2::Error& e) {
    // Every rank learns that some heap is full (AllocSymmetric's exchange),
    // so every rank keeps its private storage alike.
    if (e.code() == mc2::ErrorCode::kShmExhausted) return false;
    throw;
  }
  std::memcpy(buf.data(), s->data(), bytes);
  auto* owned = new mc2::SymmetricBuffer(std::move(buf));
  at::DataPtr ptr(owned->data(), owned, &FreeSymmetric, s->device());
  // The old memory goes with the returned DataPtr, at the end of this line.
  s->set_data_ptr(std::move(ptr));
  return true;
}

}  // namespace mc2py
