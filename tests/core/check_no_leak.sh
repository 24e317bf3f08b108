#!/bin/sh
# Runs after the other suites: no shmring segment of this user may remain.
# tools/check tags its run's job ids with SHMRING_TEST_TAG; by hand, every
# test segment of this user counts.
left=$(ls /dev/shm 2>/dev/null | grep "^shmring-$(id -u)-t-${SHMRING_TEST_TAG:-}" || true)
if [ -n "$left" ]; then
  echo "leaked shared memory segments:"; echo "$left"; exit 1
fi
echo "no shmring test segment left in /dev/shm"
