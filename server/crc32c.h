// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as used by iSCSI, ext4 and leveldb.
// Check value: Crc32c("123456789") == 0xE3069283.
#ifndef FP4Q_SERVER_CRC32C_H_
#define FP4Q_SERVER_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace fp4q::server {

// Extends `crc` (the CRC of the bytes before `data`; 0 for none) over `n` more bytes: with
// SSE4.2's crc32 instruction where the CPU has it, else Crc32cExtendPortable.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

// The same by tables (slicing-by-4), on every CPU; the reference the fast path is tested against.
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);

inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }

}  // namespace fp4q::server

#endif  // FP4Q_SERVER_CRC32C_H_
