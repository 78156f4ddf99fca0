// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The device window's records (MpiDeviceWindowComm, comm/mpi_device_window.cuh), on
///        the host: the control block of a rank's segment (the epoch words of the one protocol,
///        comm/window_protocol.hpp, and the record a call publishes), the status its kernels
///        write, the comparison of the records (host and device), and the host's list logic
///        (what a call publishes, where inputs outside the window are staged, the peers' inputs in
///        this process's mapping) and messages. Plain C++17 (no nvcc): the kernels that run the
///        protocol are in comm/device_window_protocol.cuh. The protocol: docs/gpu.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../detail/limits.hpp"
#include "../error.hpp"
#include "../layout/blocks.hpp"
#include "peer_record.hpp"
#include "window.hpp"
#include "window_protocol.hpp"

ULYSSES_NAMESPACE_BEGIN
namespace detail {

static_assert(kMaxTableRanks <= 64, "the late ranks are a 64-bit mask (DeviceWindowStatus::not_arrived)");

/// What a rank publishes for one call; its peers compare it with their own before reading.
struct DeviceWindowRecord {
  static constexpr std::uint64_t kNone = ~std::uint64_t{0};  ///< offset of an empty input
  std::uint64_t count = 0;    ///< inputs (PeerRecord::count)
  std::uint64_t layouts = 0;  ///< the publishing rank's layouts hash (PeerRecord::layouts)
  std::uint64_t reg_count = 0, reg_total = 0, reg_hash = 0;  ///< its registrations (WindowDigest)
  std::uint64_t offset[kMaxTensors] = {};  ///< input t at this offset of every rank's slot, or kNone
};

/// One rank's control block at the start of its device window segment (device memory, zeroed
/// at allocation). The words are system-scope atomics; the record is plain memory written before
/// `arrive` and read after it.
struct DeviceWindowControl {
  alignas(64) std::uint64_t epoch;   ///< the owner's calls so far (only its stream writes it)
  alignas(64) std::uint64_t arrive;  ///< epoch of the last record it published
  alignas(64) std::uint64_t done;    ///< epoch of the last call whose reads it finished
  alignas(64) std::uint64_t abort;   ///< rank 0's only: 0, or 1 + the rank that broke the group
  alignas(64) std::uint64_t missed;  ///< 0, or missed_word(e, phase): a peer's deadline passed in call e while this rank had not
                                     ///< arrived (finished reading); claimed once by a rank that timed out, before the abort word
  alignas(64) DeviceWindowRecord record;  ///< the last call's record
};

/// What a wait found (the one protocol's codes: EpochCode).
using DeviceWaitCode = EpochCode;
/// One look of a wait (the one protocol's: EpochPoll).
using DevicePoll = EpochPoll;

/// This rank's first failure, written by its kernels into mapped pinned host memory (the host
/// reads `code` first).
struct DeviceWindowStatus {
  std::uint64_t code;   ///< a DeviceWaitCode; 0 while healthy
  std::uint64_t peer;   ///< the rank it names (timeouts: the first late one; aborted: the one that broke the group)
  std::uint64_t epoch;  ///< the call (1 = the first)
  std::uint64_t field;  ///< for record_mismatch: which field
  std::uint64_t not_arrived;  ///< timeouts and aborted: bit p, rank p had not arrived (as this rank, or the group's masks, saw it)
  std::uint64_t not_done;     ///< the same for the ranks that had not finished reading
  std::uint64_t missed_call;  ///< aborted: the call in which those ranks were missing (0: no rank's deadline passed)
};

/// The group as the kernels see it: every rank's control block in this process's mapping, and
/// the layouts hash this rank's lists expect of each rank.
struct DeviceWindowGroup {
  DeviceWindowControl* ctrl[kMaxTableRanks];  ///< rank p's control block
  std::uint64_t expect_layouts[kMaxTableRanks];  ///< what rank p must publish as layouts (when check_layouts)
  int size;            ///< P
  int rank;            ///< this rank
  int check_layouts;   ///< 1: compare the peers' layouts hashes with expect_layouts
};

/// Compares every rank's record (all arrived at this epoch) with rank 0's (so that every rank
/// names the same one), and each rank's layouts hash with what this rank's lists expect; ok or
/// the first mismatch.
ULYSSES_HOST_DEVICE inline EpochPoll dw_check_records(const DeviceWindowGroup& g) {
  EpochPoll s;
  s.finished = true;
  const DeviceWindowRecord& ref = g.ctrl[0]->record;
  for (int p = 0; p < g.size; ++p) {
    const DeviceWindowRecord& r = g.ctrl[p]->record;
    std::uint64_t field = ~std::uint64_t{0};
    if (r.count != ref.count) {
      field = 0;
    } else if (r.reg_count != ref.reg_count || r.reg_total != ref.reg_total || r.reg_hash != ref.reg_hash) {
      field = 1;
    } else {
      for (std::uint64_t t = 0; t < ref.count && t < static_cast<std::uint64_t>(kMaxTensors); ++t)
        if (r.offset[t] != ref.offset[t] && r.offset[t] != DeviceWindowRecord::kNone && ref.offset[t] != DeviceWindowRecord::kNone) {
          field = 2 + t;
          break;
        }
    }
    if (field != ~std::uint64_t{0}) {
      s.code = EpochCode::record_mismatch;
      s.peer = p;
      s.field = field;
      return s;
    }
    if (g.check_layouts && r.layouts != g.expect_layouts[p]) {
      s.code = EpochCode::layouts_mismatch;
      s.peer = p;
      return s;
    }
  }
  return s;
}

/// A staging copy of with_peers(): `bytes` bytes from `src` (outside the window) to `offset` of
/// this rank's slot.
struct DeviceStageCopy {
  const std::byte* src;  ///< the input
  std::size_t offset;    ///< where it goes in the slot
  std::size_t bytes;     ///< its size
};

/// What this rank publishes for the inputs `in` (the list logic of with_peers, on the host): each
/// input inside the slot's registrations by its offset; each input outside the window staged
/// into share t of the slot's free bytes (from the end of the registrations, aligned to
/// `alignment`, split in in.count equal aligned shares: the same offsets on every rank, which
/// registered alike). Returns "" or why it cannot (an input that starts in the slot outside its
/// registrations, or does not fit its share).
/// @param reg       this rank's registrations
/// @param slot      the start of this rank's slot (in this process)
/// @param in        the inputs
/// @param alignment of the shares
/// @param rank      this rank (for the messages)
/// @param rec       the record (count, offsets, digest; layouts from `in`)
/// @param stage     the staging copies to enqueue
inline std::string device_window_record(const WindowRegistry& reg, const std::byte* slot, const PeerRecord& in, std::size_t alignment,
                                        int rank, DeviceWindowRecord& rec, std::vector<DeviceStageCopy>& stage) {
  rec = DeviceWindowRecord{};
  stage.clear();
  const int n = in.count < 0 ? 0 : (in.count > kMaxTensors ? kMaxTensors : in.count);
  rec.count = static_cast<std::uint64_t>(in.count);
  rec.layouts = in.layouts;
  rec.reg_count = reg.digest().count;
  rec.reg_total = reg.digest().total;
  rec.reg_hash = reg.digest().hash;
  for (int t = 0; t < kMaxTensors; ++t) rec.offset[t] = DeviceWindowRecord::kNone;
  const std::size_t start = round_up(reg.used(), alignment);
  const std::size_t share = n == 0 || start >= reg.bytes() ? 0 : (reg.bytes() - start) / static_cast<std::size_t>(n) / alignment * alignment;
  const std::string who = "MpiDeviceWindowComm: input ";
  for (int t = 0; t < n; ++t) {
    const std::byte* p = in.data[t];
    const std::size_t b = in.bytes[t];
    if (!p || !b) continue;
    if (reg.starts_in(slot, p)) {
      const auto off = static_cast<std::size_t>(p - slot);
      if (off + b > reg.used() || off + b < off)
        return who + std::to_string(t) + " of rank " + std::to_string(rank) + " (" + std::to_string(b) + " bytes at offset " +
               std::to_string(off) + ") starts in the device window but runs past its registrations (" + std::to_string(reg.used()) +
               " bytes): pass a registered range (MpiDeviceWindow::allocate)";
      rec.offset[t] = off;
      continue;
    }
    if (b > share)
      return who + std::to_string(t) + " of rank " + std::to_string(rank) + " (" + std::to_string(b) +
             " bytes) is outside the device window, and its share of the window's free bytes to stage it in holds " + std::to_string(share) +
             "; allocate the inputs from the window (MpiDeviceWindow::allocate) or make it larger";
    rec.offset[t] = start + static_cast<std::size_t>(t) * share;
    stage.push_back({p, static_cast<std::size_t>(rec.offset[t]), b});
  }
  return {};
}

/// Every rank's inputs in this process's mapping, as work() gets them: rank p's input t at
/// slots[p] + rec.offset[t] (the same offset on every rank: the records are compared on the
/// device), sized as this rank's; layouts as this rank's lists expect of p (in.peer_layouts).
/// @param rec   this rank's record
/// @param in    this rank's inputs
/// @param slots every rank's slot in this process (P of them)
/// @param P     ranks
/// @param views the views (P of them)
inline void device_window_views(const DeviceWindowRecord& rec, const PeerRecord& in, std::byte* const* slots, int P, PeerRecord* views) {
  for (int p = 0; p < P; ++p) {
    PeerRecord& v = views[p];
    v = PeerRecord{};
    v.count = in.count;
    v.layouts = in.peer_layouts ? in.peer_layouts[p] : 0;
    for (int t = 0; t < kMaxTensors && t < in.count; ++t) {
      if (rec.offset[t] == DeviceWindowRecord::kNone) continue;
      v.data[t] = slots[p] + rec.offset[t];
      v.bytes[t] = in.bytes[t];
    }
  }
}

/// The ranks of a mask of at most 64 (bit p: rank p), ascending.
/// @param mask the mask
inline std::vector<int> ranks_of_mask(std::uint64_t mask) {
  std::vector<int> r;
  for (int p = 0; p < 64; ++p)
    if (mask >> p & 1) r.push_back(p);
  return r;
}

/// The late ranks a status names ("ranks {2} did not arrive in call 5"; both phases, "; "
/// between), or "" when it names none.
/// @param st the status
inline std::string device_window_missing(const DeviceWindowStatus& st) {
  std::string s;
  if (st.not_arrived) s = missing_ranks(ranks_of_mask(st.not_arrived), true, st.missed_call);
  if (st.not_done) s += (s.empty() ? "" : "; ") + missing_ranks(ranks_of_mask(st.not_done), false, st.missed_call);
  return s;
}

/// The message of a device wait's verdict (DeviceWindowStatus), and its code.
/// @param st      the status (code != 0)
/// @param rank    this rank
/// @param timeout the wait bound in milliseconds
/// @param code    set to the Errc the host throws
inline std::string device_window_failure(const DeviceWindowStatus& st, int rank, long long timeout, Errc& code) {
  const std::string me = "rank " + std::to_string(rank) + ": MpiDeviceWindowComm::with_peers (call " + std::to_string(st.epoch) + ")";
  const std::string peer = std::to_string(st.peer);
  switch (static_cast<DeviceWaitCode>(st.code)) {
    case DeviceWaitCode::timeout_arrive:
    case DeviceWaitCode::timeout_done: {
      code = Errc::timeout;
      const bool arrival = st.code == static_cast<std::uint64_t>(DeviceWaitCode::timeout_arrive);
      const std::uint64_t late = arrival ? st.not_arrived : st.not_done;
      return me + " waited " + std::to_string(timeout) + " ms on the device for the peers to " + (arrival ? "arrive" : "finish reading") +
             "; " + missing_ranks(late ? ranks_of_mask(late) : std::vector<int>{static_cast<int>(st.peer)}, arrival, st.epoch) +
             " (a rank skipped the call, failed outside it, or is stuck); the group is broken";
    }
    case DeviceWaitCode::aborted: {
      code = Errc::aborted;
      const std::string missing = device_window_missing(st);
      return me + ": the device window's group is broken (rank " + peer +
             (missing.empty() ? " timed out or failed in with_peers" : " broke it: " + missing) + "); make a new MpiDeviceWindow";
    }
    case DeviceWaitCode::record_mismatch:
      code = Errc::plan_mismatch;
      return me + ": rank " + peer + " published " +
             (st.field == 0   ? std::string("another number of inputs (the ranks' plans differ)")
              : st.field == 1 ? std::string("other registrations (every rank must allocate() the same sizes in the same order)")
                              : "input " + std::to_string(st.field - 2) +
                                    " at another offset of its slot (pass the same registrations, or inputs outside the window, on every rank)") +
             " than this rank; the outputs of that call are unspecified";
    case DeviceWaitCode::layouts_mismatch:
      code = Errc::plan_mismatch;
      return me + ": rank " + peer +
             " runs a plan with other layouts or another wire than the one this rank's peer-copy lists were built from; the outputs of "
             "that call are unspecified";
    default:
      code = Errc::backend;
      return me + ": unknown device status " + std::to_string(st.code);
  }
}

}  // namespace detail
ULYSSES_NAMESPACE_END
