#!/bin/sh
# Runs after the other suites: no shmring segment of this user may remain.
left=$(ls /dev/shm 2>/dev/null | grep "^shmring-$(id -u)-t-" || true)
if [ -n "$left" ]; then
  echo "leaked shared memory segments:"; echo "$left"; exit 1
fi
echo "no shmring test segment left in /dev/shm"
