// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief What the transports share: the memory rule (the executor's memory must be the
///        communicator's for the message paths and the peer copy), message posting over a
///        plan's lists with the communicator's scratch, the flat-plan check and copy counting.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "../comm/concepts.hpp"
#include "../error.hpp"
#include "../layout/blocks.hpp"
#include "../plan/plan.hpp"

ULYSSES_NAMESPACE_BEGIN
namespace detail {

/// The executor's memory is the communicator's (both host, or both device).
template <class Comm, class Exec>
inline constexpr bool same_memory_v =
    comm_traits<Comm>::device_memory ? executor_traits<Exec>::device_memory : executor_traits<Exec>::runs_on_host;

/// An executor stand-in with the memory of communicator type Comm: supported<Comm,
/// AnyMemoryOf<Comm>> asks only what the communicator can do.
template <class Comm>
struct AnyMemoryOf {
  static constexpr bool runs_on_host = !comm_traits<Comm>::device_memory;
  static constexpr bool device_memory = comm_traits<Comm>::device_memory;
  void run(const BlockCopy*, std::size_t, const BufferTable&) {}
};

/// One exchange_messages() call over a plan's lists (Piece or Hop: peer, buffer, offset, bytes),
/// with the buffers of `t`. The message lists are the communicator's scratch (ExchangeState:
/// no allocation after its first call), or local vectors for a communicator without one.
template <class Comm, class Item>
void post_messages(Comm& comm, const BufferTable& t, const std::vector<Item>& send, const std::vector<Item>& recv) {
  auto fill = [&t](std::vector<Message>& m, const std::vector<Item>& items) {
    m.clear();
    for (const Item& i : items) m.push_back({i.peer, t.base[i.buffer] + i.offset, i.bytes});
  };
  auto post = [&](std::vector<Message>& s, std::vector<Message>& r) {
    fill(s, send);
    fill(r, recv);
    comm.exchange_messages(s.data(), s.size(), r.data(), r.size());
  };
  if constexpr (comm_traits<Comm>::exchange_state) {
    ExchangeState& st = comm.exchange_state();
    post(st.send_messages(), st.recv_messages());
  } else {
    std::vector<Message> s, r;
    post(s, r);
  }
}

/// Throws Error(path_unsupported) when a flat exchange is asked of a plan laid out for the
/// two-level exchange (its chunks partly lie in gathered / received areas).
inline void require_flat(const Plan& plan, const char* what) {
  if (plan.two_level())
    fail(Errc::path_unsupported, std::string(what) + ": the plan lays out the two-level exchange (PlanOptions::nodes " +
                                     plan.nodes().str() + "); run it with exchange_two_level() (Path::two_level), or plan with "
                                     "PlanOptions::path = Path::alltoallv or messages for a flat exchange");
}

/// Bytes a list writes (a sum counts once per element it writes).
inline double written_bytes(const std::vector<BlockCopy>& l) {
  double n = 0;
  for (const BlockCopy& c : l) n += static_cast<double>(c.written_bytes());
  return n;
}

/// The bytes each stage's transport delivers to this rank: what every flat exchange receives.
inline double received_bytes(const StageLists& s) { return static_cast<double>(s.recv_total); }

/// Copies per element of direction d when the executor runs the lists `pack` and `unpack` of
/// every stage (members of StageLists) and the transport delivers `wire(stage)` bytes, over the
/// bytes of this rank's outputs.
template <class PackList, class UnpackList, class Wire = double (*)(const StageLists&)>
CopyCount count_copies(const Plan& plan, Direction d, PackList pack, UnpackList unpack, Wire wire = received_bytes) {
  double out = 0, exec = 0, delivered = 0;
  for (int k = 0; k < plan.num_stages(); ++k) {
    const StageLists& sc = plan.stage_lists(d, k);
    out += written_bytes(sc.unpack);
    exec += written_bytes(sc.*pack) + written_bytes(sc.*unpack);
    delivered += wire(sc);
  }
  if (out == 0) return {};
  return {exec / out, delivered / out};
}

}  // namespace detail
ULYSSES_NAMESPACE_END
