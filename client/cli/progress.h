// Progress lines on stderr for long file conversions: one line per tensor with its bytes and
// the percentage of all bytes done. On a terminal the line is rewritten in place; otherwise
// (with --progress) each update is its own line. Disabled: prints nothing.
#ifndef FP4Q_CLIENT_CLI_PROGRESS_H_
#define FP4Q_CLIENT_CLI_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <string>

namespace fp4q::client::cli {

// "512 B", "4.0 KiB", "1.5 MiB", "2.0 GiB".
std::string HumanBytes(uint64_t bytes);

class Progress {
 public:
  // `total_bytes`: the bytes all updates add up to (0 is treated as 1).
  Progress(bool enabled, bool terminal, uint64_t total_bytes, std::FILE* out = stderr);
  ~Progress();

  // Tensor `index` of `count` (1-based), `name`, `tensor_bytes` of it done now; `done_bytes`
  // of the total done including it.
  void Update(const std::string& verb, size_t index, size_t count, const std::string& name,
              uint64_t tensor_bytes, uint64_t done_bytes);
  // Ends an in-place line.
  void Finish();

 private:
  bool enabled_;
  bool terminal_;
  uint64_t total_;
  std::FILE* out_;
  bool line_open_ = false;
};

}  // namespace fp4q::client::cli

#endif  // FP4Q_CLIENT_CLI_PROGRESS_H_
