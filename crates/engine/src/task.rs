//! Tasks: a cheap `poll` that says whether the `action` should run, and the `action`.

use std::os::fd::RawFd;

use crate::error::BoxError;

/// One unit of work of a scheduler (the paper's task of a generic I/O module).
///
/// `poll` must be cheap and must not block or make system calls: it looks at local state (a FIFO's
/// fill level, a counter, free room in the event manager) and answers whether `action` has work.
/// `action` does the work, at most a bounded amount of it (one batch), and returns: the scheduler
/// is cooperative, and a long action delays every other task of its thread.
pub trait Task: Send {
    /// The task's name, used in counters and profiles.
    fn name(&self) -> &str;
    /// Whether [`Task::action`] has work now.
    fn poll(&mut self) -> bool;
    /// Does the work. An error stops the scheduler: return one only for what the task cannot
    /// handle itself (a peer gone, corrupt input that must stop the run).
    fn action(&mut self) -> Result<(), BoxError>;
    /// File descriptors (sockets) whose readability means [`Task::poll`] may succeed: a parked
    /// scheduler waits in `ppoll` on them and wakes as soon as one becomes readable, instead of
    /// sleeping out its park timeout. List only descriptors whose data the task's poll or action
    /// reads (one left readable and unread would end every park at once). Default: none.
    fn wait_fds(&self, out: &mut Vec<RawFd>) {
        let _ = out;
    }
}

/// An I/O module: several tasks sharing one state (the paper's IOM: a generic core and the tasks
/// that make it a ROB, a TRG, an EBIF). The scheduler polls task `0..tasks()` of a module in
/// order, each as a task of its own; sharing the state needs no lock because one thread runs them.
pub trait Module: Send {
    /// Number of tasks.
    fn tasks(&self) -> usize;
    /// Task `task`'s name.
    fn task_name(&self, task: usize) -> String;
    /// Task `task`'s poll.
    fn poll(&mut self, task: usize) -> bool;
    /// Task `task`'s action.
    fn action(&mut self, task: usize) -> Result<(), BoxError>;
    /// File descriptors whose readability means one of the module's polls may succeed; see
    /// [`Task::wait_fds`]. Asked each time the scheduler parks. Default: none.
    fn wait_fds(&self, out: &mut Vec<RawFd>) {
        let _ = out;
    }
}

/// A single [`Task`] seen as a module of one task.
pub(crate) struct Single<T>(pub T);

impl<T: Task> Module for Single<T> {
    fn tasks(&self) -> usize {
        1
    }
    fn task_name(&self, _: usize) -> String {
        self.0.name().to_owned()
    }
    #[inline]
    fn poll(&mut self, _: usize) -> bool {
        self.0.poll()
    }
    #[inline]
    fn action(&mut self, _: usize) -> Result<(), BoxError> {
        self.0.action()
    }
    fn wait_fds(&self, out: &mut Vec<RawFd>) {
        self.0.wait_fds(out);
    }
}

/// A task made of a state and two functions of it: see [`from_fn`].
pub struct FnTask<S, P, A> {
    name: String,
    state: S,
    poll: P,
    action: A,
}

/// A task from a name, its state, a `poll` and an `action` working on that state.
///
/// ```
/// use daqflow_engine::{task, Task};
/// let mut t = task::from_fn("count-down", 3u32, |left| *left > 0, |left| {
///     *left -= 1;
///     Ok(())
/// });
/// let mut actions = 0;
/// while t.poll() {
///     t.action().unwrap();
///     actions += 1;
/// }
/// assert_eq!(actions, 3);
/// ```
pub fn from_fn<S, P, A>(name: impl Into<String>, state: S, poll: P, action: A) -> FnTask<S, P, A>
where
    S: Send,
    P: FnMut(&mut S) -> bool + Send,
    A: FnMut(&mut S) -> Result<(), BoxError> + Send,
{
    FnTask { name: name.into(), state, poll, action }
}

impl<S, P, A> FnTask<S, P, A> {
    /// The task's state.
    pub fn state(&self) -> &S {
        &self.state
    }
}

impl<S, P, A> Task for FnTask<S, P, A>
where
    S: Send,
    P: FnMut(&mut S) -> bool + Send,
    A: FnMut(&mut S) -> Result<(), BoxError> + Send,
{
    fn name(&self) -> &str {
        &self.name
    }
    fn poll(&mut self) -> bool {
        (self.poll)(&mut self.state)
    }
    fn action(&mut self) -> Result<(), BoxError> {
        (self.action)(&mut self.state)
    }
}

impl<T: Task + ?Sized> Task for Box<T> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn poll(&mut self) -> bool {
        (**self).poll()
    }
    fn action(&mut self) -> Result<(), BoxError> {
        (**self).action()
    }
}
