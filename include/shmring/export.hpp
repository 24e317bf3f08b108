#pragma once

// Symbol visibility: the library is built with -fvisibility=hidden and only
// what is marked SHMRING_API is exported.
#if defined(SHMRING_BUILDING_LIBRARY)
#define SHMRING_API __attribute__((visibility("default")))
#else
#define SHMRING_API
#endif
