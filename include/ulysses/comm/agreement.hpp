// SPDX-License-Identifier: Apache-2.0
/// @file
/// @brief The one cross-rank agreement: the communicator's size and rank against what a plan
///        was made for (check_comm_size()), every rank's record gathered (allgather_record()),
///        and the one comparison that names the fields and ranks that differ from rank 0
///        (records_differ()). Plans, decode plans, ring configurations, window registrations,
///        call numbers and device setup steps all agree through these. docs/design.md, "agreement".
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "../error.hpp"
#include "concepts.hpp"

ULYSSES_NAMESPACE_BEGIN

namespace detail {

/// "{0, 2}".
inline std::string rank_set(const std::vector<int>& r) {
  std::string s = "{";
  for (std::size_t i = 0; i < r.size(); ++i) s += (i ? ", " : "") + std::to_string(r[i]);
  return s + "}";
}

/// The ranks p in [0, P) for which pred(p) holds, ascending.
template <class Pred>
std::vector<int> ranks_where(int P, Pred&& pred) {
  std::vector<int> out;
  for (int p = 0; p < P; ++p)
    if (pred(p)) out.push_back(p);
  return out;
}

/// The one comparison of every rank's record with rank 0's: for each field whose value differs on
/// some rank, "ranks {1, 3} differ from rank 0 in <name>", followed by the values where they are
/// shown: " (ranks {1, 3}: 8; rank 0: 4)", the differing ranks grouped by value. Parts joined by
/// "; ", at most about 600 characters; "" when every record is rank 0's.
/// @param P      ranks (records)
/// @param fields fields per record
/// @param value  (p, i) -> std::uint64_t: rank p's field i (compared for equality)
/// @param name   (i) -> std::string: field i, as the message names it
/// @param shown  (p, i) -> std::string: rank p's field i as the message prints it; "" (a hash, a
///               digest) prints no values
template <class Value, class Name, class Shown>
std::string records_differ(int P, int fields, Value&& value, Name&& name, Shown&& shown) {
  auto who = [](const std::vector<int>& r) { return r.size() == 1 ? "rank " + std::to_string(r[0]) : "ranks " + rank_set(r); };
  std::string out;
  for (int i = 0; i < fields && out.size() < 600; ++i) {
    const std::vector<int> other = ranks_where(P, [&](int p) { return value(p, i) != value(0, i); });
    if (other.empty()) continue;
    std::string part = who(other) + (other.size() == 1 ? " differs" : " differ") + " from rank 0 in " + name(i);
    if (!shown(0, i).empty()) {  // the differing ranks grouped by value, in order of each value's first rank
      std::vector<bool> told(static_cast<std::size_t>(P), false);
      std::string values;
      for (int p : other) {
        if (told[static_cast<std::size_t>(p)] || values.size() > 300) continue;
        const std::vector<int> same = ranks_where(P, [&](int q) { return q >= p && !told[static_cast<std::size_t>(q)] && value(q, i) == value(p, i); });
        for (int q : same) told[static_cast<std::size_t>(q)] = true;
        values += (values.empty() ? "" : ", ") + who(same) + ": " + shown(p, i);
      }
      part += " (" + values + "; rank 0: " + shown(0, i) + ")";
    }
    out += (out.empty() ? "" : "; ") + part;
  }
  return out;
}

/// records_differ() over records of `W` words each, as gathered by allgather_record().
/// @param all    every rank's record, rank order
/// @param name   (i) -> std::string: word i's name
/// @param shown  (i, value) -> std::string: word i's value as the message prints it ("" for a hash)
template <class Record, class Name, class Shown>
std::string words_differ(const std::vector<Record>& all, Name&& name, Shown&& shown) {
  const int W = static_cast<int>(std::size(all.empty() ? Record{} : all[0]));
  return records_differ(
      static_cast<int>(all.size()), W, [&](int p, int i) { return static_cast<std::uint64_t>(all[static_cast<std::size_t>(p)][static_cast<std::size_t>(i)]); },
      name, [&](int p, int i) { return std::string(shown(i, static_cast<std::uint64_t>(all[static_cast<std::size_t>(p)][static_cast<std::size_t>(i)]))); });
}

/// records_differ() over one value per rank, printed: "ranks {1} differ from rank 0 in <name>
/// (rank 1: 8192; rank 0: 4096)", or "".
template <class T>
std::string values_differ(const std::vector<T>& all, const std::string& name) {
  return records_differ(
      static_cast<int>(all.size()), 1, [&](int p, int) { return static_cast<std::uint64_t>(all[static_cast<std::size_t>(p)]); },
      [&](int) { return name; }, [&](int p, int) { return std::to_string(all[static_cast<std::size_t>(p)]); });
}

/// The one check of a communicator against what a plan was made for.
/// @param comm   the communicator handed in
/// @param degree the plan's group size
/// @param rank   the plan's rank, or -1 for any rank
/// @param what   the plan, for the message ("the decode plan")
/// @param hint   appended to the message (what to hand in instead)
/// @throws Error(comm_mismatch) the size (or the rank) differs.
template <class Comm>
void check_comm_size(const Comm& comm, int degree, int rank, const std::string& what, const std::string& hint = "") {
  if (comm.size() == degree && (rank < 0 || comm.rank() == rank)) return;
  fail(Errc::comm_mismatch, "the communicator is rank " + std::to_string(comm.rank()) + " of " + std::to_string(comm.size()) + "; " + what +
                                " was made for " + (rank < 0 ? std::string() : "rank " + std::to_string(rank) + " of ") + "P=" +
                                std::to_string(degree) + hint);
}

/// Whether allgather_record() can run on this communicator: it has allgather() (host memory), or
/// its alltoallv() takes host memory (it does not declare `device_memory = true`).
template <class Comm>
constexpr bool can_check_agreement_v = comm_traits<Comm>::allgather || !comm_traits<Comm>::device_memory;

/// Every rank's `mine` (a record of what determines the wire) in rank order: the communicator's
/// allgather() of host memory, or an all-gather through its alltoallv() on host buffers. The
/// communicator's current call keeps its number but not its plan hash during the gather, so that
/// ranks whose plans differ meet here and learn how. Collective. @pre can_check_agreement_v<Comm>.
template <class Comm, class Record>
std::vector<Record> allgather_record(Comm& comm, int P, int me, const Record& mine) {
  std::vector<Record> all(static_cast<std::size_t>(P), mine);
  struct CallNumberOnly {
    ExchangeState* state = nullptr;
    ExchangeState::Call saved;
    ~CallNumberOnly() {
      if (state) state->set_call(saved);
    }
  } only;
  if constexpr (comm_traits<Comm>::exchange_state) {
    only.state = &comm.exchange_state();
    only.saved = only.state->call();
    only.state->set_call({only.saved.number, 0, only.saved.name});
  }
  if constexpr (comm_traits<Comm>::allgather) {
    comm.allgather(&mine, sizeof mine, all.data());
  } else {  // every peer receives this rank's record; the own chunk stays empty
    std::vector<std::size_t> sb(static_cast<std::size_t>(P), sizeof mine), so(static_cast<std::size_t>(P), 0), rb = sb, ro = so;
    for (int p = 0; p < P; ++p) ro[static_cast<std::size_t>(p)] = static_cast<std::size_t>(p) * sizeof mine;
    sb[static_cast<std::size_t>(me)] = rb[static_cast<std::size_t>(me)] = 0;
    comm.alltoallv(reinterpret_cast<const std::byte*>(&mine), sb.data(), so.data(), reinterpret_cast<std::byte*>(all.data()), rb.data(),
                   ro.data());
  }
  return all;
}

/// "" when every rank's library call (ExchangeState::call(), read by every rank alike) is rank 0's;
/// else the plan_mismatch message every rank gives: "rank 2 differs from rank 0 in the library
/// call (rank 2: call 7 (head_to_seq); rank 0: call 8 (seq_to_head)) of this communicator: ...".
/// Where a differing rank is in the same numbered call of the same name as rank 0 (another plan,
/// direction or row transforms under one name), every call shown also gives its record, the hash
/// of its kind and plan: "rank 1: call 1 (seq_to_head, record 0x...); rank 0: call 1 (seq_to_head,
/// record 0x...)", so that the two never read alike.
/// @param number callable as std::uint64_t(int p), @param what as std::uint64_t(int p),
/// @param name as const char*(int p): rank p's call
template <class Number, class What, class Name>
std::string call_mismatch(int P, Number&& number, What&& what, Name&& name) {
  auto name_of = [&](int p) -> std::string {
    const char* n = name(p);
    return n && *n ? n : "no library call";
  };
  auto key = [&](int p) { return number(p) * 0x9e3779b97f4a7c15ull ^ what(p); };
  bool same_name = false;  // a differing rank whose number and name are rank 0's: only the record tells them apart
  for (int p = 1; p < P; ++p) same_name = same_name || (key(p) != key(0) && number(p) == number(0) && name_of(p) == name_of(0));
  const std::string diff = records_differ(
      P, 1, [&](int p, int) { return key(p); }, [](int) { return std::string("the library call"); },
      [&](int p, int) {
        std::string shown = "call " + std::to_string(number(p)) + " (" + name_of(p);
        if (same_name) {
          char hex[40];
          std::snprintf(hex, sizeof hex, ", record 0x%016llx", static_cast<unsigned long long>(what(p)));
          shown += hex;
        }
        return shown + ")";
      });
  if (diff.empty()) return diff;
  return diff + " of this communicator: a rank skipped a call, or runs another (another plan, direction, or row transforms on other "
                "tensors or with other settings, such as a Rope's; the calls are not paired; every rank reports this)";
}

}  // namespace detail

ULYSSES_NAMESPACE_END
