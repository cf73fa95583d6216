// WaitHook: what a blocking call runs now and then while it waits, besides its
// own peer checks. The Python bindings pass one that takes the GIL and checks
// for signals, so Ctrl-C ends any wait (with or without a timeout) within one
// watch slice; C++ callers usually pass none.
#pragma once

#include <functional>

namespace tensorxfer::sync {

// Called at least every kWatchSlice (futex.h) while a wait sleeps, and once
// before the wait reports a timeout. It may throw to end the wait: the
// exception leaves the blocking call unchanged, and the call leaves shared
// state as if the wait had timed out. An empty hook checks nothing.
using WaitHook = std::function<void()>;

}  // namespace tensorxfer::sync
