// A connection to fp4qd's fast socket (fp4qd --fast_socket): the tensor calls of a session
// without gRPC. Wire format: FastRequest / FastReply in proto/fp4q/v1/fp4q.proto.
//
// Contract
// - Connect opens the socket (SOCK_SEQPACKET), sends the hello binding it to `session_id`
//   (from Session::id(); the session itself stays open and renewed over gRPC) and returns
//   once the server accepted it; the server's refusal comes back as its status (NOT_FOUND for
//   an unknown session, UNAUTHENTICATED for a wrong token).
// - Each call sends one frame (the method's name and its serialized request) and waits for its
//   reply: the same request and reply messages, and the same error codes and messages, as the
//   gRPC method of the same name. A request whose frame would exceed kMaxFrameBytes is refused
//   here with INVALID_ARGUMENT (use gRPC or regions for large inline tensors).
// - Waiting: the reply is busy-polled (FastSocketOptions::spin), then waited for in poll()
//   until `timeout` (DEADLINE_EXCEEDED; the server gets the same deadline). A lost connection
//   is UNAVAILABLE; the object is then unusable (Connect again).
// - The automatic spin (spin unset, the default), as the Python client's: the replies of Step
//   and UpdateWeight are busy-polled for up to twice the last such call's round trip when that
//   took at most kAutoSpinMax (kAutoSpinMax before the first), and never once it took longer,
//   for other methods, or while the server runs on the CPU backend (its work needs this host's
//   cores; learnt from the replies of ServerInfo, Step and UpdateWeight). A trainer's thread
//   has nothing else to do until its step's reply: sleeping costs its wake-up, and its core
//   idles down meanwhile (GPT-2's one-pass step on the H200: 0.757 ms sleeping, 0.713 ms with
//   the automatic spin; bench/results/h200-step/one-pass call 11). A reply of theirs expected
//   later than kAutoSpinMax but within kAutoWakeMax (a step sent with a ready signal while the
//   backward pass runs) is slept for until kAutoSpinMax before the last round trip's time, then
//   busy-polled for up to 2 * kAutoSpinMax (WakeAfter): the thread wakes before the reply.
// - HeadsUp(): after an idle gap, tells fp4qd that a call follows soon (FastRequest
//   heads_up_micros), so that its thread for this connection wakes while the caller prepares
//   the call; sent only where the server takes heads-ups (learnt from a ServerInfo reply).
// - Thread safety: calls may come from any thread; they are serialised (one frame in flight).
#ifndef FP4Q_CLIENT_FAST_SOCKET_H_
#define FP4Q_CLIENT_FAST_SOCKET_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "fp4q/v1/fp4q.pb.h"

namespace fp4q::client {

struct FastSocketOptions {
  std::string path;        // fp4qd --fast_socket
  std::string auth_token;  // fp4qd --auth_token_file's token; empty when it has none
  absl::Duration timeout = absl::Seconds(60);  // per call
  // Busy-poll each call's reply this long before sleeping in poll() (zero: always sleep; the
  // hello of Connect is always slept for); unset: the automatic spin (see above).
  std::optional<absl::Duration> spin;
};

// Replies a FastSocket waited for, by how (counted only when it busy-polled first).
struct FastSocketStats {
  uint64_t polled = 0;              // the reply came while the thread busy-polled
  uint64_t polled_then_slept = 0;   // the spin ran out and the thread slept for it
  uint64_t replied_before_spin = 0;  // a reply expected late came while the thread slept first
  uint64_t heads_ups = 0;           // heads-ups sent (HeadsUp)
};

class FastSocket {
 public:
  static constexpr size_t kMaxFrameBytes = v1::FAST_SOCKET_MAX_FRAME_BYTES;
  static constexpr absl::Duration kAutoSpinMax = absl::Milliseconds(2);
  static constexpr absl::Duration kAutoWakeMax = absl::Milliseconds(50);
  // A connection idle this long gets a heads-up; the heads-up's time (at most the server's).
  static constexpr absl::Duration kHeadsUpAfter = absl::Milliseconds(1);
  static constexpr uint32_t kHeadsUpMicros = 2000;

  static absl::StatusOr<std::unique_ptr<FastSocket>> Connect(const FastSocketOptions& options,
                                                             absl::string_view session_id);
  ~FastSocket();
  FastSocket(const FastSocket&) = delete;
  FastSocket& operator=(const FastSocket&) = delete;

  absl::StatusOr<v1::QuantizeReply> Quantize(const v1::QuantizeRequest& request);
  absl::StatusOr<v1::DequantizeReply> Dequantize(const v1::DequantizeRequest& request);
  absl::StatusOr<v1::QdqReply> Qdq(const v1::QdqRequest& request);
  absl::StatusOr<v1::MatmulReply> Matmul(const v1::MatmulRequest& request);
  absl::StatusOr<v1::UpdateWeightReply> UpdateWeight(const v1::UpdateWeightRequest& request);
  absl::StatusOr<v1::StepReply> Step(const v1::StepRequest& request);
  absl::StatusOr<v1::GetWeightReply> GetWeight(const v1::GetWeightRequest& request);
  absl::StatusOr<v1::KeepAliveReply> KeepAlive();
  absl::StatusOr<v1::ListTensorsReply> ListTensors();
  absl::StatusOr<v1::ServerInfoReply> ServerInfo();

  uint32_t lease_seconds() const { return lease_seconds_; }
  FastSocketStats stats() const;
  // How long the next call of `method` busy-polls for its reply (the fixed spin, or the
  // automatic spin's choice now).
  absl::Duration SpinFor(absl::string_view method) const;
  // With the automatic spin, how long after its send the next call of `method` sleeps before it
  // busy-polls for the reply (a reply expected late, see above); nullopt: it does not.
  std::optional<absl::Duration> WakeAfter(absl::string_view method) const;
  // Sends a heads-up (no reply comes) when the server takes them (a ServerInfo reply on this
  // connection said so: limits.fast_socket_max_heads_up_micros) and the connection has been
  // idle kHeadsUpAfter or longer; true when one was sent. A send that fails with the peer gone
  // marks the connection lost (the next call says so).
  bool HeadsUp();

  // Any method of service Fp4q by name ("Step"): `reply` receives the reply message.
  absl::Status Invoke(absl::string_view method, const google::protobuf::Message& request,
                      google::protobuf::Message* reply);

 private:
  FastSocket(int fd, FastSocketOptions options) : fd_(fd), options_(std::move(options)) {}
  // Sends `request` (its call_id is set here) and returns the matching reply, or its error.
  absl::StatusOr<v1::FastReply> Call(v1::FastRequest& request);
  // Busy-polls `spin` for the reply, then sleeps for it until `deadline`; before that, sleeps
  // until `sleep_until` when it is in the future (a reply arriving meanwhile is read at once).
  absl::Status Receive(absl::Time deadline, absl::Duration spin, absl::Time sleep_until,
                       v1::FastReply* reply);
  // The automatic spin's slot of `method` (0 Step, 1 UpdateWeight), or -1.
  static int AutoSlot(absl::string_view method);
  absl::Duration SpinForLocked(absl::string_view method) const;
  std::optional<absl::Duration> WakeAfterLocked(absl::string_view method) const;
  void SeeBackend(const google::protobuf::Message& reply);
  template <typename Reply>
  absl::StatusOr<Reply> Typed(absl::string_view method, const google::protobuf::Message& request);

  const int fd_;
  const FastSocketOptions options_;
  uint32_t lease_seconds_ = 0;
  mutable std::mutex mu_;
  uint64_t next_call_id_ = 1;    // mu_
  bool broken_ = false;          // mu_: the connection was lost
  std::vector<char> buffer_;     // mu_
  // The automatic spin's state (mu_): each slot's last round trip (negative: none yet), and
  // whether the server runs on the CPU backend.
  absl::Duration last_round_trip_[2] = {-absl::InfiniteDuration(), -absl::InfiniteDuration()};
  bool server_on_cpu_ = false;
  uint32_t heads_up_limit_ = 0;  // mu_: the server's, from a ServerInfo reply (0: none)
  absl::Time idle_since_ = absl::InfinitePast();  // mu_: the last call's end
  FastSocketStats stats_;        // mu_
};

}  // namespace fp4q::client

#endif  // FP4Q_CLIENT_FAST_SOCKET_H_
