#pragma once

// shmring: collectives between the processes of one machine over one POSIX
// shared-memory segment. Include this header for the whole C++ API.

#include "shmring/communicator.hpp"
#include "shmring/error.hpp"
#include "shmring/request.hpp"
#include "shmring/settings.hpp"
#include "shmring/types.hpp"
#include "shmring/version.hpp"
