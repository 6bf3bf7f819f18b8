// python/src/symmetric_storage.h: moving a torch tensor's storage into mc2's
// symmetric heap, so that collectives read and write it in place.
//
// A collective on a buffer outside the symmetric heap ("private") moves its
// data through the group's scratch in windows of a few MiB, a flag
// handshake with every peer per window; on a symmetric buffer the peers
// read it where it is, in one window. For buffers that a program owns and
// reuses for many collectives (the gradient buckets of DistributedDataParallel)
// it pays to move the storage once: the storage keeps its identity (every
// tensor and view sharing it sees the same values at the new address) and
// only its memory changes. So this is safe only for storage nobody holds a
// raw pointer to (a numpy array from Tensor.numpy(), a data_ptr() kept
// elsewhere): callers use it on storage they know, never on user tensors.
//
// Thread safety: the caller holds the group's lock (AllocSymmetric is a
// collective on the group) and no other thread uses the storage meanwhile.
#ifndef MC2_PYTHON_SYMMETRIC_STORAGE_H_
#define MC2_PYTHON_SYMMETRIC_STORAGE_H_

#include "common.h"

namespace mc2py {

// Collective on `group` when the storage of `t` is not symmetric yet: every
// rank allocates a symmetric buffer of the storage's size, copies the
// storage's bytes into it and makes the storage use it; the buffer is freed
// (locally, mc2's rule) when the storage is. Returns whether the storage is
// in the symmetric heap afterwards: false, on every rank alike, when a
// rank's heap has no room (the storage is left as it was). Throws the
// errors of Group::AllocSymmetric otherwise (kMismatch when the ranks'
// sizes differ).
bool MoveStorageToSymmetric(const mc2::Group& group, const at::Tensor& t);

}  // namespace mc2py

#endif  // MC2_PYTHON_SYMMETRIC_STORAGE_H_
