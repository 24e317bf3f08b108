// Not built: tests/launcher/check_settings.py self-test reads this file and
// must find the variable read below undeclared in src/base/settings.hpp.
// The macro beside it must not count (the check skips #define'd names).
#include <cstdlib>
#define SHMRING_PLANTED_MACRO 1
const char* knob = std::getenv("SHMRING_PLANTED_KNOB");
