// SPDX-License-Identifier: Apache-2.0
// topology.hpp: NodeLayout, and the two-level route a plan lays out from it (rounds, peers, message
// counts, bytes conserved); the path choice and the checks that keep flat and two-level apart.
// The bits of the two-level exchange are checked in test_redistribute (in-process) and
// test_comm_mpi (processes).
#include <doctest/doctest.h>

#include <ulysses/ulysses.hpp>

#include "expect_error.hpp"

using namespace ulysses;

TEST_CASE("NodeLayout: uniform, sizes and ids; nodes numbered by their lowest rank") {
  const NodeLayout u = NodeLayout::uniform(8, 4);
  CHECK(u.degree() == 8);
  CHECK(u.num_nodes() == 2);
  CHECK(u.spans_nodes());
  CHECK(u.members(1) == std::vector<int>{4, 5, 6, 7});
  CHECK(u.local_index(6) == 2);
  CHECK(u.str() == "[4,4]");
  const NodeLayout s = NodeLayout::sizes({4, 3});
  CHECK(s.node(3) == 0);
  CHECK(s.node(4) == 1);
  CHECK(s.str() == "[4,3]");
  const NodeLayout i = NodeLayout::of({9, 3, 9, 3, 5});
  CHECK(i.node(0) == 0);
  CHECK(i.node(1) == 1);
  CHECK(i.node(4) == 2);
  CHECK(i.members(0) == std::vector<int>{0, 2});
  CHECK(i.local_index(3) == 1);
  CHECK(NodeLayout::uniform(6, 2) == NodeLayout::of({0, 0, 1, 1, 2, 2}));
  CHECK(NodeLayout::uniform(6, 2).hash() != NodeLayout::uniform(6, 3).hash());
  const NodeLayout one;
  CHECK(one.num_nodes() == 1);
  CHECK(!one.spans_nodes());
  CHECK(one.hash() == 0);
  CHECK(ut::code_of([] { NodeLayout::of({}); }) == Errc::invalid_mesh);
  CHECK(ut::code_of([] { NodeLayout::uniform(0, 4); }) == Errc::invalid_mesh);
  CHECK(ut::code_of([] { NodeLayout::uniform(4, 0); }) == Errc::invalid_mesh);
  CHECK(ut::code_of([] { NodeLayout::sizes({2, 0}); }) == Errc::invalid_mesh);
  CHECK(ut::code_of([] { NodeLayout::sizes({}); }) == Errc::invalid_mesh);
}

namespace {
/// The plans of every rank of a q/k/v GQA layer over P ranks on `nodes`.
std::vector<Plan> plans(int P, const NodeLayout& nodes, int stages = 1, Path path = Path::automatic, int lanes = 1) {
  auto q = HeadPartition::balanced(2 * P, P);
  auto kv = HeadPartition::gqa(q, 2);
  std::vector<Plan> v;
  for (int r = 0; r < P; ++r)
    v.emplace_back(Group{P, r}, 2, SeqPartition::balanced(3 * P + 1, P),
                   std::vector<TensorSpec>{TensorSpec::of<float>(q, 4), TensorSpec::of<float>(kv, 4), TensorSpec::of<float>(kv, 2)},
                   Format::bshd, PlanOptions{stages, true, path, nodes, lanes});
  return v;
}
}  // namespace

TEST_CASE("two-level route: one inter-node message per node pair and lane, intra-node rounds inside nodes, bytes conserved") {
  struct Topo {
    int P;
    NodeLayout nodes;
  };
  for (const Topo& t : {Topo{8, NodeLayout::uniform(8, 4)}, Topo{6, NodeLayout::uniform(6, 2)}, Topo{7, NodeLayout::sizes({4, 3})},
                        Topo{6, NodeLayout::of({0, 1, 0, 1, 2, 2})}, Topo{5, NodeLayout::sizes({1, 3, 1})}})
    for (int K : {1, 3})
      for (int lanes : {1, 2, 0})
      for (Direction dir : {Direction::seq_to_head, Direction::head_to_seq}) {
        CAPTURE(t.nodes.str());
        CAPTURE(K);
        CAPTURE(lanes);
        const std::vector<Plan> ps = plans(t.P, t.nodes, K, Path::automatic, lanes);
        const int N = t.nodes.num_nodes();
        for (int k = 0; k < K; ++k) {
          std::size_t inter_msgs = 0, inter_bytes = 0, cross_chunk_bytes = 0, sent[3] = {0, 0, 0}, recvd[3] = {0, 0, 0};
          std::vector<std::vector<int>> pair_msgs(static_cast<std::size_t>(N), std::vector<int>(static_cast<std::size_t>(N), 0));
          for (int r = 0; r < t.P; ++r) {
            const Plan& p = ps[static_cast<std::size_t>(r)];
            CHECK(p.two_level());
            const StageLists& s = p.stage_lists(dir, k);
            for (int j = 0; j < t.P; ++j)
              if (t.nodes.node(j) != t.nodes.node(r)) cross_chunk_bytes += s.send_bytes[static_cast<std::size_t>(j)];
            for (int round = 0; round < 3; ++round) {
              for (const Hop& h : s.hop_send[static_cast<std::size_t>(round)]) {
                CHECK(h.bytes > 0);
                CHECK(h.peer != r);
                const bool cross = t.nodes.node(h.peer) != t.nodes.node(r);
                CHECK(cross == (round == 1));  // only the middle round leaves the node
                sent[round] += h.bytes;
                if (round == 1) {
                  ++inter_msgs;
                  inter_bytes += h.bytes;
                  ++pair_msgs[static_cast<std::size_t>(t.nodes.node(r))][static_cast<std::size_t>(t.nodes.node(h.peer))];
                }
              }
              for (const Hop& h : s.hop_recv[static_cast<std::size_t>(round)]) recvd[round] += h.bytes;
            }
          }
          for (int a = 0; a < N; ++a)
            for (int b = 0; b < N; ++b) {
              const int L = static_cast<int>(t.nodes.members(b).size()), lanes_ab = lanes == 0 ? L : std::min(lanes, L);
              CHECK(pair_msgs[static_cast<std::size_t>(a)][static_cast<std::size_t>(b)] <= lanes_ab);
            }
          if (lanes == 1) CHECK(inter_msgs <= static_cast<std::size_t>(N * (N - 1)));
          if (lanes == 0) CHECK(sent[2] == 0);  // rail-aligned: every lane's receiver is its one destination
          CHECK(inter_bytes == cross_chunk_bytes);  // every byte crosses between nodes exactly once
          for (int round = 0; round < 3; ++round) CHECK(sent[round] == recvd[round]);
        }
      }
}

TEST_CASE("two-level route: message counts of 8 = 2 x 4 (contiguous nodes merge a rank's chunks for a node)") {
  const std::vector<Plan> ps = plans(8, NodeLayout::uniform(8, 4));
  const StageLists& r0 = ps[0].stage_lists(Direction::seq_to_head);
  // Rank 0 sends its 3 node-mates their chunks and rank 1 (node 0's forwarder for node 1) one
  // message with its 4 chunks for node 1; it forwards nothing and receives for node 0 from node 1.
  CHECK(r0.hop_send[0].size() == 4);
  CHECK(r0.hop_send[1].empty());
  CHECK(r0.hop_recv[1].empty());
  // Rank 1 forwards node 0's chunks for node 1 to node 1's receiver for node 0 (local index 0 % 4:
  // rank 4), and receives node 1's for node 0 from node 1's forwarder for node 0 (rank 4).
  const StageLists& r1 = ps[1].stage_lists(Direction::seq_to_head);
  CHECK(r1.hop_send[1].size() == 1);
  CHECK(r1.hop_send[1][0].peer == 4);
  CHECK(r1.hop_recv[1].size() == 1);
  CHECK(r1.hop_recv[1][0].peer == 4);
  // ... and delivers to ranks 0, 2, 3 what node 1 sent them (one message per source rank and receiver).
  CHECK(r1.hop_send[2].size() == 3 * 4);
  // Rail-aligned lanes: local rank i of node 0 sends local rank i of node 1 one message, no delivery.
  for (const Plan& p : plans(8, NodeLayout::uniform(8, 4), 1, Path::automatic, 0)) {
    const StageLists& s = p.stage_lists(Direction::head_to_seq);
    REQUIRE(s.hop_send[1].size() == 1);
    CHECK(s.hop_send[1][0].peer == (p.rank() + 4) % 8);
    CHECK(s.hop_send[2].empty());
    CHECK(s.hop_recv[2].empty());
  }
}

TEST_CASE("two-level plans: path choice, flat exchanges refused, agreement on the node layout") {
  struct MsgComm {
    int size() const { return 8; }
    int rank() const { return 0; }
    void alltoallv(const std::byte*, const std::size_t*, const std::size_t*, std::byte*, const std::size_t*, const std::size_t*) {}
    void exchange_messages(const Message*, std::size_t, const Message*, std::size_t) {}
  };
  struct ChunkComm {
    int size() const { return 8; }
    int rank() const { return 0; }
    void alltoallv(const std::byte*, const std::size_t*, const std::size_t*, std::byte*, const std::size_t*, const std::size_t*) {}
  };
  const NodeLayout n = NodeLayout::uniform(8, 4);
  const Plan two = plans(8, n)[0];
  CHECK(choose_path<LocalGroup::Comm, HostExecutor>(two) == Path::direct);  // shared memory: no wire at all
  CHECK(choose_path<MsgComm, HostExecutor>(two) == Path::two_level);
  CHECK(ut::code_of([&] { choose_path<ChunkComm, HostExecutor>(two); }) == Errc::path_unsupported);
  const Plan flat = plans(8, n, 1, Path::alltoallv)[0];  // the flat exchange asked for
  CHECK(!flat.two_level());
  CHECK(choose_path<MsgComm, HostExecutor>(flat) == Path::alltoallv);
  CHECK(plans(4, NodeLayout{}, 1, Path::two_level)[0].two_level());  // forced on one node: one round does it all
  CHECK(!plans(4, NodeLayout::uniform(4, 4))[0].two_level());
  MsgComm c;
  BufferTable t;
  CHECK(ut::code_of([&] { exchange(two, Direction::seq_to_head, c, t); }) == Errc::path_unsupported);
  CHECK(ut::code_of([&] { exchange_pieces(two, Direction::seq_to_head, c, t); }) == Errc::path_unsupported);
  CHECK(ut::code_of([&] { exchange_two_level(flat, Direction::seq_to_head, c, t); }) == Errc::path_unsupported);
  CHECK(ut::code_of([] { plans(8, NodeLayout::uniform(6, 3)); }) == Errc::invalid_mesh);
  // Another node layout is another wire: the agreement record differs in the node word only.
  const Plan other = plans(8, NodeLayout::uniform(8, 2))[0];
  int differ = 0;
  for (int i = 0; i < kAgreementWords; ++i)
    if (two.agreement_record()[static_cast<std::size_t>(i)] != other.agreement_record()[static_cast<std::size_t>(i)]) {
      ++differ;
      CHECK(Plan::agreement_field(i).find("node layout") != std::string::npos);
    }
  CHECK(differ == 1);
  // Lanes at or above the largest node all mean one lane per rank: the same wire, the same record.
  CHECK(plans(8, NodeLayout::uniform(8, 2), 1, Path::automatic, 2)[0].agreement_record() ==
        plans(8, NodeLayout::uniform(8, 2), 1, Path::automatic, 5)[0].agreement_record());
  CHECK(plans(8, NodeLayout::uniform(8, 4), 1, Path::automatic, 2)[0].agreement_record() !=
        plans(8, NodeLayout::uniform(8, 4), 1, Path::automatic, 0)[0].agreement_record());
  CHECK(ut::code_of([] { plans(8, NodeLayout::uniform(8, 4), 1, Path::automatic, -1); }) == Errc::invalid_shape);
  // Copies: pack and unpack as the flat all-to-all-v; the transport also carries forwarded chunks.
  const CopyCount cc = two.copies(Direction::seq_to_head, Path::two_level);
  CHECK(cc.executor == doctest::Approx(two.copies(Direction::seq_to_head, Path::alltoallv).executor));
  CHECK(cc.transport >= two.copies(Direction::seq_to_head, Path::alltoallv).transport);
}
