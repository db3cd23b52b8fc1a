// Random ids (chatcmpl-..., msg_..., resp_...) and request seeds, per thread, from the OS's
// entropy: not reproducible by design (a request that wants reproducibility sends its seed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fs::server {

std::string random_hex(std::size_t n);  // n lowercase hex digits
std::uint64_t random_seed();

}  // namespace fs::server
