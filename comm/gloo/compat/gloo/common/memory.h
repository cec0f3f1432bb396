#pragma once

// Debian's libgloo-dev (20220518) ships gloo/transport/tcp/unbound_buffer.h
// but not the gloo/common/memory.h it includes. Only comm/gloo/
// completions.cc sees this folder, to read counts that come before the one
// member whose type this header names (the buffer's last): where the real
// header exists it is used; else these stand-ins make the class definition
// compile. Nothing here is ever constructed or called.
#if __has_include_next(<gloo/common/memory.h>)
#include_next <gloo/common/memory.h>
#else
namespace gloo {

template <typename T>
class ShareableNonOwningPtr {
 public:
  explicit ShareableNonOwningPtr(T* ptr) : ptr_(ptr) {}

 private:
  T* ptr_;
};

template <typename T>
class WeakNonOwningPtr {
 public:
  explicit WeakNonOwningPtr(const ShareableNonOwningPtr<T>&) {}
};

}  // namespace gloo
#endif
