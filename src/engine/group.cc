// The public Group API: world set-up, Split, symmetric memory, one-sided
// access, signals and point-to-point messages.
#include "mc2/group.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>
#include <utility>

#include "core/checked.h"
#include "core/enforce.h"
#include "core/env.h"
#include "core/log.h"
#include "core/placement.h"
#include "engine/access.h"
#include "engine/group_impl.h"
#include "engine/net.h"
#include "trace/recorder.h"

namespace mc2 {
namespace internal {

struct SymmetricAllocation {
  std::shared_ptr<World> world;
  const GroupImpl* group = nullptr;  // identity only: Put/Get check it
  std::vector<uint64_t> offsets;     // heap offset on each member
  int rank = 0;
  size_t bytes = 0;
  ~SymmetricAllocation() { world->heap->Free(offsets[rank]); }
};

namespace {

// The rank and world size the world's spans are recorded under
// (WorldOptions::trace_rank): the options' pair, else the transport's own.
std::pair<int, int> TraceIdentity(const WorldOptions& options, const transport::Transport& tx) {
  if (options.trace_rank < 0 && options.trace_world_size < 0) return {tx.rank(), tx.size()};
  if (!(options.trace_rank >= 0 && options.trace_rank < options.trace_world_size))
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("WorldOptions: trace_rank {} and trace_world_size {} must be set "
                            "together, with 0 <= trace_rank < trace_world_size",
                            options.trace_rank, options.trace_world_size));
  return {options.trace_rank, options.trace_world_size};
}

}  // namespace

std::shared_ptr<World> MakeWorld(std::unique_ptr<transport::Transport> tx,
                                 const WorldOptions& options) {
  const auto [trace_rank, trace_world_size] = TraceIdentity(options, *tx);
  const size_t scratch_bytes =
      options.scratch_bytes != 0
          ? GroupImpl::CheckScratchBytes(options.scratch_bytes, "WorldOptions::scratch_bytes")
          : GroupImpl::DefaultScratchBytes();
  // MC2_TRACE, the thread's rank and name for spans (see trace/recorder.h).
  trace::OnWorldStart(trace_rank, trace_world_size);
  std::shared_ptr<World> world(new World, DestroyWorld);
  world->trace_rank = trace_rank;
  world->timeout = options.timeout.count() > 0
                       ? options.timeout
                       : core::EnvDuration("MC2_TIMEOUT", std::chrono::seconds(300));
  world->deterministic = options.deterministic >= 0 ? options.deterministic != 0
                                                    : core::EnvBool("MC2_DETERMINISTIC", true);
  world->strict_check = core::EnvBool("MC2_CHECK", false);
  world->heap = std::make_unique<engine::HeapAllocator>(transport::kHeapHeaderBytes,
                                                        tx->HeapBytes());
  world->oversubscribed = tx->size() > core::HostCpus();
  world->slots = GroupImpl::SlotsFor(world->oversubscribed);
  world->scratch_bytes = scratch_bytes;
  world->transport = std::move(tx);
  World* raw = world.get();
  world->engine = std::make_unique<engine::ProgressEngine>([raw](const std::exception_ptr& ep) {
    try {
      std::rethrow_exception(ep);
    } catch (const Error& e) {
      raw->transport->Abort(e);
    } catch (const std::exception& e) {
      raw->transport->Abort(Error(ErrorCode::kInternal, e.what()));
    } catch (...) {
      raw->transport->Abort(Error(ErrorCode::kInternal, "unknown exception"));
    }
  });
  return world;
}

// The world group's control area is the first allocation of every heap, so
// its offset is the same on every rank without any exchange.
std::shared_ptr<GroupImpl> MakeWorldGroup(std::shared_ptr<World> world) {
  int size = world->transport->size();
  int rank = world->transport->rank();
  size_t scratch = world->scratch_bytes;
  size_t need = GroupImpl::AreaBytes(size, world->slots, scratch);
  auto off = world->heap->Allocate(need);
  if (!off)
    throw Error(ErrorCode::kShmExhausted,
                fmt::format("the symmetric heap ({} bytes per rank) cannot hold the world "
                            "group's {} bytes of control area and scratch; raise "
                            "MC2_HEAP_BYTES / --heap or lower MC2_SCRATCH_BYTES",
                            world->transport->HeapBytes(), need),
                rank, "init");
  GroupImpl::ClearArea(world->transport->HeapBase(rank) + *off, size, world->slots);
  std::vector<int> members(size);
  std::iota(members.begin(), members.end(), 0);
  auto g = std::make_shared<GroupImpl>(std::move(world), std::move(members), rank,
                                       std::vector<uint64_t>(size, *off), scratch);
  // The first operation doubles as the start-up barrier.
  g->RunSync("init", [](OpContext& ctx) {
    Fingerprint fp;
    fp.kind = static_cast<uint16_t>(OpKind::kInit);
    fp.count = static_cast<uint64_t>(ctx.g->size());
    // Settings every rank must share: the collectives' paths and windows
    // depend on them (WorldOptions::scratch_bytes, MC2_DETERMINISTIC).
    fp.aux = (static_cast<uint64_t>(ctx.g->scratch_bytes()) << 2) |
             (ctx.g->world().strict_check ? 2 : 0) | (ctx.g->world().deterministic ? 1 : 0);
    // And the slot window (GroupImpl::SlotsFor), which places every
    // eager operation's data: init has no root, so the field carries it.
    fp.root = static_cast<int>(ctx.g->slots());
    ctx.g->Arrive(ctx, fp, nullptr, 0, nullptr, 0);
  });
  return g;
}

namespace {

Fingerprint ExchangeFingerprint(uint64_t what, uint64_t count) {
  Fingerprint fp;
  fp.kind = static_cast<uint16_t>(OpKind::kExchange);
  fp.aux = what;
  fp.count = count;
  return fp;
}

}  // namespace
}  // namespace internal

using internal::Fingerprint;
using internal::GroupImpl;
using internal::OpContext;
using internal::OpKind;

Group Group::FromEnv(const WorldOptions& options) {
  core::ValidateEnvironment();
  // The calling (compute) thread is bound first, so that the threads the
  // world starts inherit its CPUs; the progress thread then moves to its
  // own (core/placement.h).
  const core::Placement& place = core::PlaceThisProcess();
  // Started by mpirun or srun rather than `mc2 run`: the job's world over
  // MPI between hosts and shared memory within each (engine/net.h).
  if (!transport::LaunchedByMc2() && transport::LaunchedByMpi())
    return internal::MakeNetWorldGroup(-1, options);
  auto tx = transport::CreateTransportFromEnv(options.link);
  auto world = internal::MakeWorld(std::move(tx), options);
  if (place.bound()) world->engine->BindThread(place.progress);
  return Group(internal::MakeWorldGroup(std::move(world)));
}

namespace internal {
Group FromMPIHandle(int64_t comm_f, const WorldOptions& options) {
  core::ValidateEnvironment();
  MC2_CHECK_ARG(comm_f >= 0, "FromMPI: invalid communicator handle {}", comm_f);
  return MakeNetWorldGroup(comm_f, options);
}
}  // namespace internal

bool Group::LaunchedByMpi() { return !transport::LaunchedByMc2() && transport::LaunchedByMpi(); }

bool Group::LaunchedByMc2() { return transport::LaunchedByMc2(); }

Group Group::FromRendezvous(int rank, int size, const AllGatherStrings& all_gather,
                            const WorldOptions& options) {
  core::ValidateEnvironment();
  MC2_CHECK_ARG(static_cast<bool>(all_gather), "FromRendezvous needs an all_gather function");
  auto tx = transport::CreateRendezvousTransport(rank, size, options.heap_bytes, all_gather,
                                                 options.link);
  // The ranks (checked by now) are those of one host: its local ranks.
  // Bound as in FromEnv; a launcher that bound them already is respected.
  const core::Placement& place =
      core::PlaceThisProcess(core::LocalRank{rank, size, "FromRendezvous"});
  auto world = internal::MakeWorld(std::move(tx), options);
  if (place.bound()) world->engine->BindThread(place.progress);
  return Group(internal::MakeWorldGroup(std::move(world)));
}

void Group::RunInProcess(int size, const std::function<void(Group&)>& body,
                         const WorldOptions& options) {
  core::ValidateEnvironment();
  size_t heap = options.heap_bytes ? options.heap_bytes : size_t{64} << 20;
  auto txs = transport::CreateInProcessTransports(size, heap, options.link);
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r, tx = std::move(txs[r])]() mutable {
      std::shared_ptr<internal::World> world;
      auto record = [&](std::exception_ptr ep, const Error& e) {
        // Abort so that the other ranks' pending operations fail promptly.
        if (world) world->transport->Abort(e);
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = ep;
      };
      try {
        world = internal::MakeWorld(std::move(tx), options);
        Group g(internal::MakeWorldGroup(world));
        body(g);
      } catch (const Error& e) {
        record(std::current_exception(), e);
      } catch (const std::exception& e) {
        record(std::current_exception(),
               Error(ErrorCode::kInternal, fmt::format("rank {} threw: {}", r, e.what())));
      } catch (...) {
        record(std::current_exception(),
               Error(ErrorCode::kInternal, fmt::format("rank {} threw", r)));
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

int Group::rank() const { return impl_->rank(); }
int Group::size() const { return impl_->size(); }
int Group::world_rank() const { return impl_->world_rank(impl_->rank()); }
int Group::num_hosts() const {
  return impl_->net_group ? static_cast<int>(impl_->net_group->hosts.size()) : 1;
}
std::chrono::nanoseconds Group::timeout() const { return impl_->world().timeout; }
bool Group::deterministic() const { return impl_->world().deterministic; }

Group Group::Split(int color, int key) const {
  MC2_CHECK_ARG(impl_, "Split on an invalid (empty) group");
  if (impl_->net_group) return internal::NetSplit(*impl_, color, key);
  GroupImpl* g = impl_.get();
  int n = g->size();
  struct Entry {
    int32_t color;
    int32_t key;
  };
  std::vector<Entry> all(n);
  g->RunSync("split", [&](OpContext& ctx) {
    g->Arrive(ctx, internal::ExchangeFingerprint(1, 0), nullptr, 0, nullptr, 0);
    Entry mine{color, key};
    g->ExchangeInline(ctx, &mine, sizeof(mine), all.data());
  });
  std::vector<int> order;  // old group ranks in the new group, sorted
  for (int r = 0; r < n; ++r)
    if (all[r].color == color && color >= 0) order.push_back(r);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return all[a].key < all[b].key; });
  int new_size = static_cast<int>(order.size());
  size_t scratch = g->world().scratch_bytes;
  uint64_t mine = internal::kPrivate;
  if (color >= 0) {
    if (auto off = g->world().heap->Allocate(GroupImpl::AreaBytes(new_size, g->slots(), scratch))) {
      mine = *off;
      // The memory may have held an older group's flags, which only grow:
      // start from zero before any peer learns where the area is.
      GroupImpl::ClearArea(g->HeapPtr(g->rank(), mine), new_size, g->slots());
    }
  }
  std::vector<uint64_t> offs(n);
  g->RunSync("split", [&](OpContext& ctx) {
    g->Arrive(ctx, internal::ExchangeFingerprint(2, 0), nullptr, 0, nullptr, 0);
    g->ExchangeInline(ctx, &mine, sizeof(mine), offs.data());
  });
  if (color < 0) return Group();
  std::vector<int> members;
  std::vector<uint64_t> areas;
  int new_rank = -1;
  std::string failed;
  for (int i = 0; i < new_size; ++i) {
    int r = order[i];
    if (r == g->rank()) new_rank = i;
    members.push_back(g->world_rank(r));
    areas.push_back(offs[r]);
    if (offs[r] == internal::kPrivate) failed += fmt::format(" {}", r);
  }
  if (!failed.empty()) {
    if (mine != internal::kPrivate) g->world().heap->Free(mine);
    throw Error(ErrorCode::kShmExhausted,
                fmt::format("Split: the symmetric heap of rank(s){} cannot hold the new group's "
                            "control area ({} bytes); raise MC2_HEAP_BYTES",
                            failed, GroupImpl::AreaBytes(new_size, g->slots(), scratch)),
                g->rank(), "split");
  }
  auto child = std::make_shared<GroupImpl>(g->world_ptr(), std::move(members), new_rank,
                                           std::move(areas), scratch);
  return Group(child);
}

SymmetricBuffer::SymmetricBuffer(SymmetricBuffer&& o) noexcept { *this = std::move(o); }
SymmetricBuffer& SymmetricBuffer::operator=(SymmetricBuffer&& o) noexcept {
  alloc_ = std::move(o.alloc_);
  data_ = std::exchange(o.data_, nullptr);
  bytes_ = std::exchange(o.bytes_, 0);
  return *this;
}
SymmetricBuffer::~SymmetricBuffer() = default;

SymmetricBuffer Group::AllocSymmetric(size_t bytes) const {
  MC2_CHECK_ARG(impl_, "AllocSymmetric on an invalid (empty) group");
  // Every rank passes the same size, so every rank fails here alike, before
  // the exchange. Within this bound the heap's rounding up to its alignment
  // cannot wrap to a small block.
  core::CheckBufferBytes("AllocSymmetric", "a request", bytes);
  // Across hosts the buffer is symmetric within each host: collectives use
  // it in place inside the node; Put, Get and signals are not offered.
  if (impl_->net_group)
    return internal::Access::MakeGroup(impl_->net_group->node).AllocSymmetric(bytes);
  GroupImpl* g = impl_.get();
  auto off = g->world().heap->Allocate(bytes);
  uint64_t mine = off ? *off : internal::kPrivate;
  std::vector<uint64_t> offs(g->size());
  try {
    g->RunSync("alloc_symmetric", [&](OpContext& ctx) {
      g->Arrive(ctx, internal::ExchangeFingerprint(3, bytes), nullptr, 0, nullptr, 0);
      g->ExchangeInline(ctx, &mine, sizeof(mine), offs.data());
    });
  } catch (...) {
    if (off) g->world().heap->Free(*off);
    throw;
  }
  std::string failed;
  for (int r = 0; r < g->size(); ++r)
    if (offs[r] == internal::kPrivate) failed += fmt::format(" {}", r);
  if (!failed.empty()) {
    if (off) g->world().heap->Free(*off);
    throw Error(ErrorCode::kShmExhausted,
                fmt::format("AllocSymmetric({} bytes): the symmetric heap of rank(s){} is full "
                            "(this rank has {} bytes free, largest block {}); raise "
                            "MC2_HEAP_BYTES / `mc2 run --heap`",
                            bytes, failed, g->world().heap->free_bytes(),
                            g->world().heap->largest_free()),
                g->rank(), "alloc_symmetric");
  }
  auto a = std::make_shared<internal::SymmetricAllocation>();
  a->world = g->world_ptr();
  a->group = g;
  a->offsets = std::move(offs);
  a->rank = g->rank();
  a->bytes = bytes;
  SymmetricBuffer buf;
  buf.data_ = g->tx().HeapBase(g->world_rank(g->rank())) + a->offsets[a->rank];
  buf.bytes_ = bytes;
  buf.alloc_ = std::move(a);
  return buf;
}

bool Group::IsSymmetric(const void* ptr, size_t bytes) const {
  if (impl_->net_group) return impl_->net_group->node->HeapOffset(ptr, bytes) != internal::kPrivate;
  return impl_->HeapOffset(ptr, bytes) != internal::kPrivate;
}

namespace {
char* PeerAddress(const Group& g, const SymmetricBuffer& b,
                  const std::shared_ptr<internal::SymmetricAllocation>& a, int peer,
                  size_t offset, size_t bytes, const char* what) {
  MC2_CHECK_ARG(!internal::Access::Impl(g)->net_group,
                "{}: one-sided access is not available on a group that spans hosts (its "
                "members on other hosts share no memory with this rank); use Send/Recv or a "
                "collective",
                what);
  MC2_CHECK_ARG(a && a->group == internal::Access::Impl(g),
                "{}: the buffer was not allocated by this group", what);
  MC2_CHECK_ARG(peer >= 0 && peer < g.size(), "{}: peer {} out of range [0, {})", what, peer,
                g.size());
  // Compared without forming offset + bytes, which may wrap.
  MC2_CHECK_ARG(offset <= a->bytes && bytes <= a->bytes - offset,
                "{}: {} bytes at offset {} exceed the buffer's {} bytes", what, bytes, offset,
                a->bytes);
  return internal::Access::Impl(g)->HeapPtr(peer, a->offsets[peer]) + offset;
}
}  // namespace

void Group::Put(const SymmetricBuffer& buffer, int peer, size_t offset, const void* src,
                size_t bytes) const {
  MC2_CHECK_ARG(impl_, "Put on an invalid (empty) group");
  MC2_CHECK_ARG(src || bytes == 0, "Put: src is null but {} bytes are needed", bytes);
  core::CheckBufferRange("Put", "src", src, bytes);
  char* at = PeerAddress(*this, buffer, buffer.alloc_, peer, offset, bytes, "Put");
  if (bytes) std::memcpy(at, src, bytes);  // memcpy needs valid pointers even for 0 bytes
}

void Group::Get(const SymmetricBuffer& buffer, int peer, size_t offset, void* dst,
                size_t bytes) const {
  MC2_CHECK_ARG(impl_, "Get on an invalid (empty) group");
  MC2_CHECK_ARG(dst || bytes == 0, "Get: dst is null but {} bytes are needed", bytes);
  core::CheckBufferRange("Get", "dst", dst, bytes);
  const char* at = PeerAddress(*this, buffer, buffer.alloc_, peer, offset, bytes, "Get");
  if (bytes) std::memcpy(dst, at, bytes);
}

namespace {
void CheckNotNet(const GroupImpl* g, const char* what) {
  MC2_CHECK_ARG(!g->net_group,
                "{}: signals are not available on a group that spans hosts (its members on other "
                "hosts share no memory with this rank); use Send/Recv or a collective",
                what);
}
}  // namespace

void Group::SignalAdd(int peer, int slot, uint64_t value) const {
  CheckNotNet(impl_.get(), "SignalAdd");
  MC2_CHECK_ARG(peer >= 0 && peer < size(), "SignalAdd: peer {} out of range [0, {})", peer,
                size());
  MC2_CHECK_ARG(slot >= 0 && slot < kNumSignals, "SignalAdd: slot {} out of range [0, {})", slot,
                kNumSignals);
  impl_->tx().RemoteAdd(impl_->world_rank(peer), impl_->Abs(peer, GroupImpl::SignalOff(slot)),
                        value);
}

void Group::WaitSignal(int slot, uint64_t value) const {
  CheckNotNet(impl_.get(), "WaitSignal");
  MC2_CHECK_ARG(slot >= 0 && slot < kNumSignals, "WaitSignal: slot {} out of range [0, {})",
                slot, kNumSignals);
  transport::WaitContext wc;
  wc.op = "wait_signal";
  transport::Clock::time_point deadline{};
  wc.deadline = &deadline;
  wc.timeout = timeout();
  wc.describe_missing = [&] {
    return fmt::format("signal {} to reach {} (it is {})", slot, value, ReadSignal(slot));
  };
  impl_->tx().WaitGE(world_rank(), impl_->Abs(rank(), GroupImpl::SignalOff(slot)), value, wc);
}

uint64_t Group::ReadSignal(int slot) const {
  CheckNotNet(impl_.get(), "ReadSignal");
  MC2_CHECK_ARG(slot >= 0 && slot < kNumSignals, "ReadSignal: slot {} out of range [0, {})",
                slot, kNumSignals);
  return impl_->tx().Peek(world_rank(), impl_->Abs(rank(), GroupImpl::SignalOff(slot)));
}

// ---------------------------------------------------------------------------
// Point-to-point (see engine/p2p_engine.h).

Work Group::Send(const void* data, size_t bytes, int peer, int tag) const {
  MC2_CHECK_ARG(impl_, "Send on an invalid (empty) group");
  MC2_CHECK_ARG(tag >= 0, "Send: tag {} is negative (user tags are ints >= 0)", tag);
  MC2_CHECK_ARG(peer >= 0 && peer < size() && peer != rank(),
                "Send: peer {} must be another rank in [0, {})", peer, size());
  MC2_CHECK_ARG(data || bytes == 0, "Send: null buffer with {} bytes", bytes);
  core::CheckBufferRange("Send", "data", data, bytes);
  if (impl_->net_group)
    return internal::NetSendRecv(*impl_, true, static_cast<char*>(const_cast<void*>(data)), bytes,
                                 peer, tag);
  return impl_->world().P2P().Post(impl_, true, static_cast<char*>(const_cast<void*>(data)),
                                   bytes, peer, tag);
}

Work Group::Recv(void* data, size_t bytes, int peer, int tag) const {
  MC2_CHECK_ARG(impl_, "Recv on an invalid (empty) group");
  MC2_CHECK_ARG(tag >= 0, "Recv: tag {} is negative (user tags are ints >= 0)", tag);
  MC2_CHECK_ARG(peer >= 0 && peer < size() && peer != rank(),
                "Recv: peer {} must be another rank in [0, {})", peer, size());
  MC2_CHECK_ARG(data || bytes == 0, "Recv: null buffer with {} bytes", bytes);
  core::CheckBufferRange("Recv", "data", data, bytes);
  if (impl_->net_group)
    return internal::NetSendRecv(*impl_, false, static_cast<char*>(data), bytes, peer, tag);
  return impl_->world().P2P().Post(impl_, false, static_cast<char*>(data), bytes, peer, tag);
}

}  // namespace mc2
