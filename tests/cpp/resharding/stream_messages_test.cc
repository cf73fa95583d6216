// Streams between hosts cut into messages: the sizes both sides compute alike,
// direct messages where the memory is contiguous, staged copies elsewhere, and a
// byte-exact round trip through a simulated wire.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "tensorxfer/common/error.h"
#include "tensorxfer/copy/copy_engine.h"
#include "tensorxfer/resharding/stream_messages.h"

namespace tensorxfer::resharding {
namespace {

TEST(MessageSizesTest, SmallItemsShareBucketsAndMayStraddleThem) {
  EXPECT_EQ(message_sizes({100, 100, 100}, 1000), (std::vector<uint64_t>{300}));
  EXPECT_EQ(message_sizes({400, 400, 400}, 1000), (std::vector<uint64_t>{1000, 200}));
  EXPECT_EQ(message_sizes({0, 0}, 1000), (std::vector<uint64_t>{}));
}

TEST(MessageSizesTest, AnItemOfHalfABucketOrMoreStartsItsOwnMessages) {
  EXPECT_EQ(message_sizes({100, 500, 100}, 1000), (std::vector<uint64_t>{100, 500, 100}));
  EXPECT_EQ(message_sizes({100, 2500, 100, 100}, 1000), (std::vector<uint64_t>{100, 1000, 1000, 500, 200}));
  EXPECT_EQ(message_sizes({3000}, 1000), (std::vector<uint64_t>{1000, 1000, 1000}));
  EXPECT_THROW(message_sizes({1}, 0), InvalidArgument);
  EXPECT_THROW(message_sizes({UINT64_MAX, 1}, 1000), InvalidArgument);
}

TEST(CutStreamTest, AContiguousStreamIsSentAndReceivedInPlace) {
  std::vector<std::byte> memory(3000);
  const Pieces a{Piece{memory.data(), 1000}}, b{Piece{memory.data() + 1000, 2000}};
  const Pieces stream = concatenate_pieces({&a, &b});
  ASSERT_EQ(stream.size(), 1u);  // adjacent tasks merge
  const auto messages = cut_stream(stream, {1024, 1024, 952}, StreamSide::kSend, {}, 0);
  ASSERT_EQ(messages.size(), 3u);
  for (std::size_t k = 0; k < messages.size(); ++k) {
    EXPECT_EQ(messages[k].direct, memory.data() + 1024 * k);
    EXPECT_TRUE(messages[k].copies.empty());
  }
}

TEST(CutStreamTest, MessagesAcrossPiecesAreStagedAndNeedABuffer) {
  std::vector<std::byte> memory(4096);
  const Pieces rows{Piece{memory.data(), 100}, Piece{memory.data() + 1000, 100}, Piece{memory.data() + 2000, 300}};
  EXPECT_EQ(staged_count(rows, {150, 350}), 2u);
  EXPECT_EQ(staged_count(rows, {100, 100, 300}), 0u);
  EXPECT_THROW(cut_stream(rows, {150, 350}, StreamSide::kSend, {}, 0), InvalidArgument);
  std::vector<std::byte> small(100);
  EXPECT_THROW(cut_stream(rows, {150, 350}, StreamSide::kSend, {small.data()}, small.size()), InvalidArgument);
  EXPECT_THROW(cut_stream(rows, {150, 300}, StreamSide::kSend, {}, 0), InvalidArgument);  // sizes != bytes
  EXPECT_THROW(cut_stream(rows, {0, 500}, StreamSide::kSend, {}, 0), InvalidArgument);
}

// Sender: three strided rows and a contiguous tail; receiver: other pieces. Every
// message goes through a "wire" buffer, from staging or in place, both ways.
TEST(CutStreamTest, ARoundTripThroughTheWireDeliversEveryByteInStreamOrder) {
  std::vector<std::byte> source(8192), destination(8192, std::byte{0});
  for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<std::byte>(i * 7 + 3);
  const Pieces send_rows{Piece{source.data(), 300}, Piece{source.data() + 1000, 300},
                         Piece{source.data() + 2000, 300}, Piece{source.data() + 4000, 2000}};
  const Pieces recv_rows{Piece{destination.data() + 100, 900}, Piece{destination.data() + 3000, 2000}};
  const std::vector<uint64_t> sizes = message_sizes({900, 2000}, 1024);
  ASSERT_EQ(sizes, (std::vector<uint64_t>{900, 1024, 976}));
  std::vector<std::byte> send_a(1024), send_b(1024), recv_a(1024), recv_b(1024), wire(1024);
  const auto sends = cut_stream(send_rows, sizes, StreamSide::kSend, {send_a.data(), send_b.data()}, 1024);
  const auto recvs = cut_stream(recv_rows, sizes, StreamSide::kReceive, {recv_a.data(), recv_b.data()}, 1024);
  EXPECT_EQ(sends[0].direct, nullptr);               // three rows: staged
  EXPECT_EQ(sends[1].direct, source.data() + 4000);  // the tail: in place
  EXPECT_EQ(recvs[0].direct, destination.data() + 100);
  copy::CopyEngine engine(1);
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    copy::copy_spans(sends[k].copies, &engine);
    const std::byte* from = sends[k].direct ? sends[k].direct : (k % 2 ? send_b : send_a).data();
    std::byte* into = recvs[k].direct ? recvs[k].direct : (k % 2 ? recv_b : recv_a).data();
    std::memcpy(wire.data(), from, sizes[k]);
    std::memcpy(into, wire.data(), sizes[k]);
    copy::copy_spans(recvs[k].copies, &engine);
  }
  std::vector<std::byte> expected;
  for (const Piece& piece : send_rows) expected.insert(expected.end(), piece.data, piece.data + piece.nbytes);
  std::vector<std::byte> got;
  for (const Piece& piece : recv_rows) got.insert(got.end(), piece.data, piece.data + piece.nbytes);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(destination[99], std::byte{0});  // nothing outside the receiver's pieces
  EXPECT_EQ(destination[1000], std::byte{0});
  EXPECT_EQ(destination[5000], std::byte{0});
}

}  // namespace
}  // namespace tensorxfer::resharding
