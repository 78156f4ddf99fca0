// SPDX-License-Identifier: Apache-2.0
// decode/exchange.hpp over MpiComm under real processes (ctest runs this under mpiexec -n 2, 3, 4
// and 8): the decode exchange on the whole world and on sub-communicators, each case checked bit
// for bit against the ascending-rank merge of the same partials and against single-rank attention
// in double (tests/support/decode_case.hpp); C16; C18 (LSE +inf / NaN on empty rows: the bits of
// -inf); both collectives (MPI_Alltoallv, and one MPI_Isend/Irecv per peer); the direct path over
// MpiWindowComm (the peers' partials read in place from the node's shared window); the all-gather
// variant; coded errors before any collective.
#include <ulysses/comm/mpi.hpp>
#include <ulysses/comm/mpi_window.hpp>

#include "mpi_groups.hpp"

#include "decode_case.hpp"
#include "expect_error.hpp"

using namespace ulysses;
using ud::c16;
using ud::DecodeCase;
using ut::world_size;

namespace {

/// Runs case c on sub-communicators of c.P ranks (world ranks [k*P, k*P+P)); ranks left over sit
/// out. Returns every participating rank's report, "" when all agree with the references (an
/// all-reduce of the failures, so every rank sees the same verdict), or "skipped" when P exceeds
/// the world.
std::string run_mpi(const DecodeCase& c) {
  int wr = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  const int n = world_size();
  if (c.P > n) return "skipped";
  const int color = wr < (n / c.P) * c.P ? wr / c.P : MPI_UNDEFINED;
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, color, wr, &sub);
  std::string mine;
  if (sub != MPI_COMM_NULL) {
    MpiComm comm(sub);
    mine = ud::run_decode_case(comm, c);
    MPI_Comm_free(&sub);
  }
  int bad = mine.empty() ? 0 : 1, any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any ? (mine.empty() ? std::string("another rank failed") : mine) : "";
}

}  // namespace

TEST_CASE("MPI C16: an empty KV shard (P=4): merged output == single-rank attention, no NaN; a row with no key anywhere: 0 and -inf") {
  DecodeCase c = c16();
  for (bool rr : {false, true})
    for (std::int64_t no_keys : {-1, 1}) {
      c.round_robin = rr, c.no_keys = no_keys;
      const std::string r = run_mpi(c);
      if (r == "skipped") return;
      CAPTURE(rr);
      CAPTURE(no_keys);
      CHECK(r == "");
    }
}

TEST_CASE("MPI C18: P=4, empty rows with LSE +inf or NaN (on one rank, and on every rank): the same bits as with -inf there, both collectives and the window's direct path; a row with no key anywhere is 0 and -inf") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  if (world_size() < 4) return;  // P=4: one shard per rank
  int wr = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, wr < 4 ? 0 : MPI_UNDEFINED, wr, &sub);
  int cases = 0;
  for (const std::vector<float>& empty : {std::vector<float>{inf}, std::vector<float>{nan}, std::vector<float>{inf, nan, -inf}})
    for (Path path : {Path::alltoallv, Path::messages, Path::direct})
      for (DecodeOutput out : {DecodeOutput::heads, DecodeOutput::all_heads})
        for (std::int64_t T : {1, 4}) {
          DecodeCase c = ud::c18(empty);
          c.path = path, c.output = out, c.T = T, c.partial_type = ElementType::bfloat16;
          DecodeCase ref = c;
          ref.empty_lse = {-inf};
          std::string mine;
          if (sub != MPI_COMM_NULL) {
            MpiComm comm(sub);
            ud::DecodeResult got, want;
            if (path == Path::direct) {  // the peers' partials read in place from the node's shared window
              MpiWindow win(comm, std::size_t{1} << 16);
              MpiWindowComm wc(comm, win);
              mine = ud::run_decode_case(wc, c, 2, &got) + ud::run_decode_case(wc, ref, 2, &want);
            } else {
              mine = ud::run_decode_case(comm, c, 2, &got) + ud::run_decode_case(comm, ref, 2, &want);
            }
            if (got.out != want.out) mine += "rank " + std::to_string(wr) + ": output differs from the run with -inf\n";
            if (got.out_lse != want.out_lse) mine += "rank " + std::to_string(wr) + ": output LSE differs from the run with -inf\n";
          }
          int bad = mine.empty() ? 0 : 1, any = 0;
          MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
          CAPTURE(empty.size());
          CAPTURE(empty[0]);
          CAPTURE(to_string(path));
          CAPTURE(to_string(out));
          CAPTURE(T);
          CHECK(mine == "");
          REQUIRE(any == 0);
          ++cases;
        }
  if (sub != MPI_COMM_NULL) MPI_Comm_free(&sub);
  CHECK(cases == 3 * 3 * 2 * 2);
}

TEST_CASE("MPI: every P that fits the world, T in {1,4}, contiguous and round-robin KV, GQA/MQA, H % P != 0, both collectives, both outputs") {
  std::uint64_t seed = 500;
  struct Heads {
    std::int64_t H, Hkv;
  };
  for (int P : {2, 3, 4, 8})
    for (std::int64_t T : {1, 4})
      for (bool rr : {false, true})
        for (Heads hh : {Heads{8, 2}, Heads{7, 1}, Heads{3, 3}})
          for (Path path : {Path::alltoallv, Path::messages})
            for (DecodeOutput out : {DecodeOutput::heads, DecodeOutput::all_heads}) {
              DecodeCase c;
              c.P = P, c.T = T, c.round_robin = rr, c.H = hh.H, c.Hkv = hh.Hkv, c.B = 2, c.S = 4 * P + 1, c.path = path, c.output = out;
              c.seed = ++seed;
              c.empty = {{P - 1, 1}};
              const std::string r = run_mpi(c);
              if (r == "skipped") continue;
              CAPTURE(P);
              CAPTURE(T);
              CAPTURE(rr);
              CAPTURE(hh.H);
              CAPTURE(to_string(path));
              CAPTURE(to_string(out));
              REQUIRE(r == "");
            }
}

TEST_CASE("MPI: bf16 partials with fp32 LSE, bf16 and fp32 outputs, base 2, strided layouts that differ between ranks") {
  for (ElementType out : {ElementType::bfloat16, ElementType::float32})
    for (LseBase base : {LseBase::natural, LseBase::two})
      for (int lay : {0, 1, 2}) {
        DecodeCase c = c16();
        c.P = world_size(), c.H = 12, c.Hkv = 4, c.T = 4, c.S = 5 * c.P, c.partial_type = ElementType::bfloat16, c.out_type = out;
        c.base = base, c.layouts = lay, c.empty = {{0, 2}};
        CAPTURE(to_string(out));
        CAPTURE(lay);
        CHECK(run_mpi(c) == "");
      }
}

TEST_CASE("MPI: the direct path over MpiWindowComm (partials staged into the shared window, read in place by the peers): both outputs, bf16, exact") {
  for (DecodeOutput out : {DecodeOutput::heads, DecodeOutput::all_heads}) {
    DecodeCase c = c16();
    c.P = world_size(), c.H = 12, c.Hkv = 4, c.T = 4, c.S = 5 * c.P, c.path = Path::direct, c.output = out;
    c.partial_type = ElementType::bfloat16, c.empty = {{0, 2}};
    MpiComm comm(MPI_COMM_WORLD);
    MpiWindow win(comm, std::size_t{1} << 16);  // room to stage O_r and LSE_r (they lie outside the window)
    MpiWindowComm wc(comm, win);
    const std::string mine = ud::run_decode_case(wc, c);
    int bad = mine.empty() ? 0 : 1, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    CAPTURE(to_string(out));
    CHECK(mine == "");
    CHECK(any == 0);
  }
}

TEST_CASE("MPI: ranks that planned different exchanges all throw plan_mismatch at the first call; bad buffers throw before any collective") {
  int wr = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  DecodeCase c = c16();
  c.P = world_size();
  if (wr == c.P - 1) c.B = 4;  // the last rank planned another batch
  MpiComm comm(MPI_COMM_WORLD);
  const auto [code, msg] = ut::error_of([&] { ud::run_decode_case(comm, c); });
  CHECK(code == Errc::plan_mismatch);
  CHECK(msg.find("differs from rank 0 in the batch B") != std::string::npos);
  // A workspace too small on every rank: every rank throws, none enters the exchange (a hang would time the test out).
  c.B = 3;
  const DecodePlan plan(ud::spec_of(c, wr), wr);
  std::vector<std::byte> in(plan.partial_span_bytes()), lse(plan.lse_span_bytes()), out(plan.out_span_bytes()), ws(plan.workspace_bytes());
  const DecodeBuffers b = DecodeBuffers().partial(in).lse(lse).out(out).workspace({ws.data(), ws.size() / 2});
  CHECK(ut::code_of([&] { decode_exchange(plan, comm, HostDecodeExecutor{}, b); }) == Errc::workspace_too_small);
  MPI_Barrier(MPI_COMM_WORLD);
}

int main(int argc, char** argv) { return ut::mpi_doctest_main(argc, argv); }
