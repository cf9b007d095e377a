// C ABI of the shim. Tensors are tch's handles: `at::Tensor*`.
// Functions return nullptr on success or a malloc'ed message (free with ptx_free).
#pragma once
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <exception>
#include <string>

typedef void* ptx_tensor;

inline char* ptx_error(const std::string& message) {
  char* out = static_cast<char*>(std::malloc(message.size() + 1));
  std::memcpy(out, message.c_str(), message.size() + 1);
  return out;
}

#define PTX_TRY try {
#define PTX_CATCH                                         \
  }                                                       \
  catch (const std::exception& e) {                       \
    return ptx_error(e.what());                           \
  }                                                       \
  return nullptr;

extern "C" void ptx_free(char* message);
