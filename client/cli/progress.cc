#include "progress.h"

#include "absl/strings/str_format.h"

namespace fp4q::client::cli {

std::string HumanBytes(uint64_t bytes) {
  if (bytes < 1024) return absl::StrFormat("%d B", bytes);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 3) {
    v /= 1024.0;
    ++u;
  }
  return absl::StrFormat("%.1f %s", v, units[u]);
}

Progress::Progress(bool enabled, bool terminal, uint64_t total_bytes, std::FILE* out)
    : enabled_(enabled), terminal_(terminal), total_(total_bytes == 0 ? 1 : total_bytes),
      out_(out) {}

Progress::~Progress() { Finish(); }

void Progress::Update(const std::string& verb, size_t index, size_t count,
                      const std::string& name, uint64_t tensor_bytes, uint64_t done_bytes) {
  if (!enabled_) return;
  const double pct = 100.0 * static_cast<double>(done_bytes) / static_cast<double>(total_);
  const std::string line = absl::StrFormat("fp4q: [%d/%d] %s %s (%s) %5.1f%%", index, count,
                                           verb, name, HumanBytes(tensor_bytes), pct);
  if (terminal_) {
    absl::FPrintF(out_, "\r\033[K%s", line);
    line_open_ = true;
  } else {
    absl::FPrintF(out_, "%s\n", line);
  }
  std::fflush(out_);
}

void Progress::Finish() {
  if (line_open_) {
    std::fputc('\n', out_);
    std::fflush(out_);
    line_open_ = false;
  }
}

}  // namespace fp4q::client::cli
