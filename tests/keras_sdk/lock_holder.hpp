// A run that holds a checkpoint directory's lock: a forked child that takes it and waits to be
// killed (SIGKILL it to play a run that died without letting go). Shared by the checkpoint tests.
#pragma once

#include <skyforge/keras_callbacks.hpp>

#include <sys/types.h>
#include <unistd.h>

#include <filesystem>

// The child's pid once it holds the lock; -1 when the fork or the lock failed. Fork before any
// thread starts.
inline pid_t fork_lock_holder(const std::filesystem::path& dir) {
  int ready[2];
  if (::pipe(ready) != 0) return -1;
  const pid_t child = ::fork();
  if (child < 0) {
    ::close(ready[0]);
    ::close(ready[1]);
    return -1;
  }
  if (child == 0) {
    ::close(ready[0]);
    try {
      skyforge::keras::CheckpointLock l = skyforge::keras::CheckpointLock::acquire(dir);
      if (::write(ready[1], "1", 1) != 1) ::_exit(2);
      for (;;) ::pause();
    } catch (...) {
      ::_exit(1);
    }
  }
  ::close(ready[1]);
  char c = 0;
  const bool held = ::read(ready[0], &c, 1) == 1;
  ::close(ready[0]);
  return held ? child : -1;
}
