// Must compile, and shows that the public headers bring no dependency of
// the library's into their users' code: neither fmt (a program bundling
// another fmt must not clash with it), nor libuv, hiredis or Connector/C;
// and that what their public functions take is public.
#include <lockwatch/lockwatch.hpp>

#ifdef FMT_VERSION
#error "a public lockwatch header includes fmt"
#endif
#ifdef UV_VERSION_MAJOR
#error "a public lockwatch header includes libuv"
#endif
#ifdef HIREDIS_MAJOR
#error "a public lockwatch header includes hiredis"
#endif
#ifdef MYSQL_VERSION_ID
#error "a public lockwatch header includes Connector/C"
#endif

// What public functions take is public: ThreadPool::post takes a
// lockwatch::UniqueFunction.
void (lockwatch::ThreadPool::*post)(lockwatch::UniqueFunction) = &lockwatch::ThreadPool::post;

int main() {}
