// Whole-file reads and writes for tests.
#ifndef FP4Q_TESTS_TESTING_FILES_H_
#define FP4Q_TESTS_TESTING_FILES_H_

#include <fstream>
#include <iterator>
#include <string>

namespace fp4q::testing {

// The file's bytes; empty when it cannot be read.
inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Replaces the file's contents with `bytes`.
inline void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace fp4q::testing

#endif  // FP4Q_TESTS_TESTING_FILES_H_
