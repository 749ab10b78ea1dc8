// libFuzzer target: fp4qd's fast socket (server/fast_socket.h) with its real connection thread.
//
//   bytes -> byte 0: flags (bit 0: the harness sends a valid hello first) -> the rest is cut
//   into frames (a 2-byte little-endian length, then that many bytes, the last one cut short
//   by the end of the input) -> each frame is sent over a fresh SOCK_SEQPACKET connection to a
//   FastSocketServer in this process, over the fuzz fixture's engine (fuzz_fixture.h) -> the
//   reply is read.
//
// A frame that parses as a FastRequest naming a known method gets the placeholders in its
// request replaced (the request bytes parsed as that method's request, by protobuf reflection,
// at any depth) before it is sent: a string field "session_id" equal to "M" or "O" becomes the
// caller's or the other session's id, a "region_id" of "R" or "S" the caller's or the other
// session's region, so the fuzzer reaches the checks behind them without guessing 128-bit ids.
//
// What counts as a bug: any sanitizer report, a crash, a hang, or a broken invariant:
// - every frame gets exactly one reply, within 10 s, that parses as a FastReply;
// - the reply's call_id is the request's (0 when the frame was not a FastRequest);
// - code 0 carries a reply that parses as the method's reply (or the hello reply); any other
//   code is a google.rpc.Code with a message and no reply;
// - the other session's region is never written;
// - after the client closes, the server's connection count returns to 0 and Stop() returns.
//
// Seeds: FP4Q_FUZZ_WRITE_SEEDS=DIR writes the built-in seeds to DIR and exits.
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fp4q/v1/fp4q.pb.h"
#include "fuzz/fuzz_fixture.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/reflection.h"
#include "server/call_layer.h"
#include "server/fast_socket.h"
#include "server/op_table.h"
#include "server/logging.h"

namespace fp4q::server {
namespace {

namespace v1 = ::fp4q::v1;
using fuzzing::Check;
using fuzzing::Fixture;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

struct Ids {
  std::string mine, other, region, other_region;
};

// Replaces the placeholders (see the header) anywhere in `m`.
void Substitute(Message* m, const Ids& ids, int depth = 0) {
  if (depth > 16) return;
  const google::protobuf::Reflection* r = m->GetReflection();
  std::vector<const FieldDescriptor*> fields;
  r->ListFields(*m, &fields);
  for (const FieldDescriptor* f : fields) {
    if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
      if (f->is_repeated()) {
        for (int i = 0; i < r->FieldSize(*m, f); ++i) {
          Substitute(r->MutableRepeatedMessage(m, f, i), ids, depth + 1);
        }
      } else {
        Substitute(r->MutableMessage(m, f), ids, depth + 1);
      }
    } else if (f->type() == FieldDescriptor::TYPE_STRING && !f->is_repeated()) {
      const std::string v = r->GetString(*m, f);
      if (f->name() == "session_id" && (v == "M" || v == "O")) {
        r->SetString(m, f, v == "M" ? ids.mine : ids.other);
      } else if (f->name() == "region_id" && (v == "R" || v == "S")) {
        r->SetString(m, f, v == "R" ? ids.region : ids.other_region);
      }
    }
  }
}

int Connect(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  Check(fd >= 0, "socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  int rc;
  do {
    rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  Check(rc == 0, "connect");
  return fd;
}

// Sends one frame and checks its one reply.
void Exchange(int fd, const std::string& frame) {
  v1::FastRequest request;
  const bool is_request = !frame.empty() && frame.size() <= FastSocketServer::kMaxFrameBytes &&
                          request.ParseFromString(frame);
  // libFuzzer's -timeout alarm (SIGALRM) interrupts system calls: retry on EINTR.
  ssize_t sent;
  do {
    sent = ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  Check(sent == static_cast<ssize_t>(frame.size()), "send");
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  int ready = 0;
  while (ready == 0 || (ready < 0 && errno == EINTR)) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    ready = ::poll(&p, 1, static_cast<int>(left.count()));
  }
  Check(ready == 1, "a reply within 10 s");
  std::string buf(FastSocketServer::kMaxFrameBytes + 1, '\0');
  ssize_t n;
  do {
    n = ::recv(fd, buf.data(), buf.size(), 0);
  } while (n < 0 && errno == EINTR);
  Check(n > 0 && static_cast<size_t>(n) <= FastSocketServer::kMaxFrameBytes,
        "a reply frame within the limit");
  v1::FastReply reply;
  Check(reply.ParseFromArray(buf.data(), static_cast<int>(n)), "the reply parses");
  Check(reply.call_id() == (is_request ? request.call_id() : 0), "the reply's call_id");
  Check(reply.code() >= 0 && reply.code() <= 16, "a google.rpc.Code");
  if (reply.code() == 0) {
    Check(is_request, "OK answers a request");
    if (request.has_hello()) {
      Check(reply.has_hello(), "OK to a hello carries the hello reply");
    } else {
      const Op* op = FindOp(request.method());
      Check(op != nullptr, "OK answers a known method");
      std::unique_ptr<Message> m(op->reply_prototype->New());
      Check(m->ParseFromString(reply.reply()), "OK carries the method's reply");
    }
  } else {
    Check(!reply.message().empty(), "an error names what is wrong");
    Check(reply.reply().empty() && !reply.has_hello(), "an error carries no reply");
  }
  if (std::getenv("FP4Q_FUZZ_VERBOSE") != nullptr) {
    std::fprintf(stderr, "fuzz_fast_socket: %d %s\n", reply.code(), reply.message().c_str());
  }
}

void RunOne(const uint8_t* data, size_t size) {
  std::unique_ptr<Fixture> f = fuzzing::MakeFixture();
  const std::vector<uint8_t> before = f->other_memory;
  const Ids ids{f->mine.session_id, f->other_session, f->region, f->other_region};
  static Logger logger(LogFormat::kText, stderr);  // fp4qd logs only refusals here
  FastSocketOptions o;
  o.path = absl::StrCat("/tmp/fp4q-fuzz-fast-", ::getpid(), ".sock");
  o.allowed_uids = {::geteuid()};
  CallLayer layer(f->engine.get(), nullptr, CallLayerOptions{});
  absl::StatusOr<std::unique_ptr<FastSocketServer>> server =
      FastSocketServer::Create(&layer, nullptr, o, &logger);
  Check(server.ok(), "fast socket server");
  (*server)->Start();
  const int fd = Connect(o.path);
  if (size > 0 && (data[0] & 1) != 0) {
    v1::FastRequest hello;
    hello.set_call_id(1);
    hello.mutable_hello()->set_session_id(ids.mine);
    Exchange(fd, hello.SerializeAsString());
  }
  size_t at = size > 0 ? 1 : 0;
  for (int frames = 0; at < size && frames < 64; ++frames) {
    size_t len = data[at];
    if (at + 1 < size) len |= static_cast<size_t>(data[at + 1]) << 8;
    at += 2;
    if (at > size) at = size;
    len = std::min(len, size - at);
    std::string frame(reinterpret_cast<const char*>(data + at), len);
    at += len;
    v1::FastRequest request;
    if (!frame.empty() && request.ParseFromString(frame)) {
      Substitute(&request, ids);  // the hello's session id
      if (const Op* op = FindOp(request.method()); op != nullptr) {
        std::unique_ptr<Message> inner(op->request_prototype->New());
        if (inner->ParseFromString(request.request())) {
          Substitute(inner.get(), ids);
          inner->SerializeToString(request.mutable_request());
        }
      }
      frame = request.SerializeAsString();
      if (frame.empty()) continue;  // an empty FastRequest: zero bytes (tested by e2e)
    }
    Exchange(fd, frame);
  }
  ::close(fd);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((*server)->connections() != 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  Check((*server)->connections() == 0, "the connection ends when its client closes");
  (*server)->Stop();
  Check(f->other_memory == before, "another session's region was written");
}

void Seed(const char* dir, const std::string& name, uint8_t flags,
          const std::vector<std::string>& frames) {
  std::string bytes(1, static_cast<char>(flags));
  for (const std::string& f : frames) {
    bytes.push_back(static_cast<char>(f.size() & 0xff));
    bytes.push_back(static_cast<char>((f.size() >> 8) & 0xff));
    bytes += f;
  }
  std::ofstream(absl::StrCat(dir, "/seed-", name), std::ios::binary) << bytes;
}

void WriteSeeds(const char* dir) {
  auto frame = [](uint64_t id, const std::string& method, const Message& request) {
    v1::FastRequest r;
    r.set_call_id(id);
    r.set_method(method);
    request.SerializeToString(r.mutable_request());
    return r.SerializeAsString();
  };
  auto hello = [](uint64_t id, const std::string& session) {
    v1::FastRequest r;
    r.set_call_id(id);
    r.mutable_hello()->set_session_id(session);
    return r.SerializeAsString();
  };
  v1::Tensor t;
  t.set_dtype(v1::DTYPE_F32);
  t.add_shape(2);
  t.add_shape(32);
  t.set_inline_data(testing::RandomF32(64, 3));
  v1::QuantizeRequest q;
  *q.mutable_input() = t;
  q.mutable_options()->set_rounding(v1::ROUNDING_STOCHASTIC);
  v1::QuantizeRequest qr;
  qr.mutable_input()->set_dtype(v1::DTYPE_F32);
  qr.mutable_input()->add_shape(16);
  qr.mutable_input()->add_shape(32);
  qr.mutable_input()->mutable_region()->set_region_id("R");
  qr.mutable_rowwise_codes()->mutable_region()->set_region_id("R");
  qr.mutable_rowwise_codes()->mutable_region()->set_offset(4096);
  qr.mutable_rowwise_scales()->mutable_region()->set_region_id("S");
  v1::QdqRequest qdq;
  *qdq.mutable_input() = t;
  qdq.mutable_options()->set_residual_key("r");
  qdq.mutable_options()->set_step(4);
  v1::UpdateWeightRequest u;
  u.set_name("w");
  u.set_step(6);
  u.mutable_update()->set_dtype(v1::DTYPE_F32);
  u.mutable_update()->add_shape(16);
  u.mutable_update()->add_shape(32);
  u.mutable_update()->set_inline_data(testing::RandomF32(16 * 32, 4, 0.01f));
  u.set_return_dequantized(true);
  v1::StepRequest step;
  step.set_step(7);
  step.add_groups()->set_lr(0.1f);
  v1::StepItem* item = step.add_items();
  item->set_name("w");
  *item->mutable_update() = u.update();
  item->set_return_dequantized(true);
  v1::DequantizeRequest dq;
  dq.mutable_input()->set_weight_name("plain");
  v1::MatmulRequest mm;
  mm.mutable_a()->set_weight_name("w");
  mm.mutable_b()->set_weight_name("plain");
  v1::FastRequest deadline;
  deadline.set_call_id(11);
  deadline.set_timeout_micros(uint64_t{1} << 40);
  deadline.set_method("KeepAlive");
  Seed(dir, "hello-quantize", 0,
       {hello(2, "M"), frame(4, "Quantize", q), frame(10, "KeepAlive", v1::KeepAliveRequest())});
  Seed(dir, "before-hello", 0, {frame(4, "Quantize", q), hello(3, "O"), hello(2, "M")});
  Seed(dir, "regions", 1, {frame(5, "Quantize", qr), frame(6, "Qdq", qdq)});
  Seed(dir, "state", 1,
       {frame(7, "UpdateWeight", u), frame(8, "Dequantize", dq), frame(9, "Matmul", mm),
        frame(12, "Step", step), frame(13, "OpenSession", v1::OpenSessionRequest())});
  Seed(dir, "garbage", 1,
       {std::string("\xff\xfe garbage"), deadline.SerializeAsString(), std::string(3, '\0'),
        frame(14, "NoSuchMethod", v1::KeepAliveRequest())});
}

}  // namespace
}  // namespace fp4q::server

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  if (const char* dir = std::getenv("FP4Q_FUZZ_WRITE_SEEDS"); dir != nullptr && *dir != '\0') {
    fp4q::server::WriteSeeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fp4q::server::RunOne(data, size);
  return 0;
}
