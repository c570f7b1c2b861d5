//! The operator's sequencer on virtual time: a scripted world of components answers its
//! requests (or does not), processes die, time jumps; every decision is checked.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use daqflow_api::{ComponentState, RunState, SystemState, Transition, TransitionResult};
use daqflow_component::schema::{DRAIN_INTO_RESERVE_KEY, Key, Schema};
use daqflow_component::{
    Answer, Command, CommandReply, Component, ComponentError, ComponentStatus, Info, Kind, Outcome, Registry, Request,
    Role, State, Stats, TriggerCounts, Verb,
};
use daqflow_runcontrol::operator::OperatorError;
use daqflow_runcontrol::operator::sequencer::{CloseRun, Input, Now, Output, Sequencer, SequencerConfig};
use daqflow_runcontrol::system::SystemFile;
use serde_json::json;

struct Stub;
impl Component for Stub {
    fn start(&mut self, _: u32) -> Result<(), ComponentError> {
        Ok(())
    }
    fn stop(&mut self, _: Option<u64>) -> Result<Stats, ComponentError> {
        Ok(Stats::default())
    }
}

fn registry() -> Registry {
    let mut r = Registry::new();
    for (name, role) in [
        ("evm", Role::Trigger),
        ("ru", Role::Readout),
        ("bu", Role::Builder),
        ("source", Role::Readout),
        ("recorder", Role::Recorder),
    ] {
        let k = Kind::new(name, "stub", role, |_, _| Ok(Box::new(Stub)));
        r.add(if name == "source" { k.stages(7, 1) } else { k });
    }
    // A recorder with a reserve above its high mark on its disk: the live key the operator
    // sets when it declares the disk full.
    let reserve = Key::bool(DRAIN_INTO_RESERVE_KEY, "drain into the reserve").live(&[State::Running, State::Paused]);
    r.add(
        Kind::new("reserve-recorder", "stub", Role::Recorder, |_, _| Ok(Box::new(Stub)))
            .schema(Schema::new("reserve-recorder").key(reserve)),
    );
    r
}

const SYSTEM: &str = r#"
[system]
name = "sim"
[[component]]
name = "rec"
kind = "recorder"
[[component]]
name = "evm"
kind = "evm"
[component.params]
rus = 1
[[component]]
name = "bu-0"
kind = "bu"
policy = "restart"
[component.params]
evm = "${evm.listen}"
[[component]]
name = "ru-0"
kind = "ru"
[component.params]
evm = "${evm.listen}"
[[component]]
name = "src"
kind = "source"
stop_arg = "${evm.last_event}"
"#;

/// A world of components around the sequencer.
struct World {
    seq: Sequencer,
    now: Now,
    pid: u32,
    /// What each component's process says its state is.
    states: HashMap<String, (u32, u64, State, Option<u32>)>,
    /// Requests sent and not answered yet (id → component, request).
    inbox: BTreeMap<u64, (String, Request)>,
    /// Every request in the order sent.
    log: Vec<(String, Command)>,
    /// Answers to tickets.
    done: HashMap<u64, Result<TransitionResult, OperatorError>>,
    /// Runs closed.
    closed: Vec<CloseRun>,
    next_run: u32,
    ticket: u64,
    /// Components that answer by themselves (success) as soon as asked.
    auto: bool,
    /// Components that never answer.
    silent: Vec<String>,
    /// Components that refuse this verb.
    refuse: Vec<(String, Verb)>,
    /// Components whose hook fails at this verb: the answer is an error and the component is in
    /// Error (as the driver leaves it).
    fail: Vec<(String, Verb)>,
}

impl World {
    fn new(text: &str) -> World {
        let file = SystemFile::parse(text, &registry()).unwrap_or_else(|e| panic!("{e}"));
        let mut config = SequencerConfig::new("operator");
        config.timeout = Duration::from_secs(20);
        config.stop_timeout = Duration::from_secs(60);
        World {
            seq: Sequencer::new(file, config),
            now: Now::start(),
            pid: 100,
            states: HashMap::new(),
            inbox: BTreeMap::new(),
            log: Vec::new(),
            done: HashMap::new(),
            closed: Vec::new(),
            next_run: 1,
            ticket: 0,
            auto: true,
            silent: Vec::new(),
            refuse: Vec::new(),
            fail: Vec::new(),
        }
    }

    /// A world whose components are launched and joined.
    fn launched() -> World {
        let mut w = World::new(SYSTEM);
        let t = w.ask_launch();
        assert!(matches!(w.done.remove(&t), Some(Ok(_))), "launched");
        w
    }

    fn feed(&mut self, input: Input) {
        let mut queue = vec![input];
        while !queue.is_empty() {
            let input = queue.remove(0);
            for o in self.seq.handle(input, self.now) {
                queue.extend(self.world(o));
            }
        }
    }

    fn status(&mut self, name: &str) -> ComponentStatus {
        let (pid, seq, state, run) = self
            .states
            .get_mut(name)
            .map(|s| {
                s.1 += 1;
                *s
            })
            .expect("a live component");
        ComponentStatus {
            name: name.into(),
            kind: "k".into(),
            pid,
            incarnation: Some(u64::from(pid) * 10),
            seq,
            state,
            run,
            since_ms: self.now.wall_ms,
            error: None,
            cpus: None,
        }
    }

    /// What the world does with an output; the inputs it causes.
    fn world(&mut self, o: Output) -> Vec<Input> {
        match o {
            Output::Spawn { name } => {
                self.pid += 1;
                self.states.insert(name.clone(), (self.pid, 0, State::Initial, None));
                let status = self.status(&name);
                let incarnation = Some(u64::from(self.pid) * 10);
                vec![Input::Spawned { name, pid: self.pid, incarnation }, Input::Status(status)]
            }
            Output::Send { to, request } => {
                self.log.push((to.clone(), request.command.clone()));
                self.inbox.insert(request.id, (to, request));
                if self.auto { self.answer_all() } else { Vec::new() }
            }
            Output::OpenRun { requested } => {
                let run = requested.unwrap_or(self.next_run);
                self.next_run = run + 1;
                vec![Input::RunOpened(Ok(run))]
            }
            Output::CloseRun(c) => {
                let mut s = daqflow_runcontrol::db::example_summary(c.run, 0);
                s.errors = c.errors.clone();
                s.state = if c.errors.is_empty() { RunState::Stopped } else { RunState::Failed };
                s.error = (!c.errors.is_empty()).then(|| c.errors.join("; "));
                self.closed.push(*c);
                vec![Input::RunClosed(Box::new(s))]
            }
            Output::Done { ticket, result } => {
                self.done.insert(ticket, result);
                Vec::new()
            }
        }
    }

    /// Every request waiting gets its answer (unless its component is silent or dead).
    fn answer_all(&mut self) -> Vec<Input> {
        let ids: Vec<u64> = self.inbox.keys().copied().collect();
        ids.into_iter().filter_map(|id| self.answer(id)).collect()
    }

    fn answer(&mut self, id: u64) -> Option<Input> {
        let (name, request) = self.inbox.get(&id).cloned()?;
        if self.silent.contains(&name) || !self.states.contains_key(&name) {
            return None;
        }
        self.inbox.remove(&id);
        let verb = request.command.verb();
        let (state, run) = (self.states[&name].2, self.states[&name].3);
        let result = if self.refuse.contains(&(name.clone(), verb)) {
            Err(ComponentError::Refused(format!("{verb} refused")))
        } else if let Command::Set { key, .. } = &request.command
            && key != "rate_hz"
            && key != DRAIN_INTO_RESERVE_KEY
        {
            // The stub's live parameters are `rate_hz` (and a recorder's reserve).
            Err(ComponentError::Refused(format!(
                "`{key}` cannot change after configure; the live parameters of {name} are: rate_hz"
            )))
        } else if self.fail.contains(&(name.clone(), verb)) {
            self.states.get_mut(&name).unwrap().2 = State::Error;
            Err(ComponentError::Failed(format!("{verb} failed")))
        } else {
            let (next, answer) = match &request.command {
                Command::Configure { .. } => {
                    let mut info = Info::new();
                    info.insert("listen".into(), json!(format!("127.0.0.1:{}", 7000 + self.pid)));
                    (State::Configured, Answer::Info(info))
                }
                Command::Start { run } => (State::Running, Answer::Run(*run)),
                Command::Pause => (State::Paused, Answer::Nothing),
                Command::Resume => (State::Running, Answer::Nothing),
                Command::Stop { .. } => {
                    let mut s = Stats::counted(10, 100).with_detail(&json!({"last_event": 42}));
                    if name == "evm" {
                        s.trigger = Some(TriggerCounts { triggered: 10, built: 10, ..Default::default() });
                    }
                    (State::Configured, Answer::Summary(s))
                }
                Command::Reset => (State::Initial, Answer::Nothing),
                Command::Set { .. } => (state, Answer::Nothing),
            };
            let run = if let Answer::Run(r) = answer { Some(r) } else { run };
            let _ = state;
            let entry = self.states.get_mut(&name).unwrap();
            entry.2 = next;
            entry.3 = run;
            Ok(answer)
        };
        let status = self.status(&name);
        let reply = CommandReply::new(&request, status, result);
        Some(Input::Reply(reply))
    }

    fn reply_all(&mut self) {
        for i in self.answer_all() {
            self.feed(i);
        }
    }

    fn ask(&mut self, t: Transition) -> u64 {
        self.ticket += 1;
        let ticket = self.ticket;
        self.feed(Input::Request { ticket, transition: t });
        ticket
    }

    fn ask_launch(&mut self) -> u64 {
        self.ticket += 1;
        let ticket = self.ticket;
        self.feed(Input::Launch { ticket });
        ticket
    }

    fn run(&mut self, t: Transition) -> Result<TransitionResult, OperatorError> {
        let ticket = self.ask(t);
        self.done.remove(&ticket).unwrap_or_else(|| panic!("{t:?} did not end; inbox {:?}", self.inbox))
    }

    fn pass(&mut self, d: Duration) {
        self.now = self.now.after(d);
        self.feed(Input::Tick);
    }

    fn kill(&mut self, name: &str) {
        self.states.remove(name);
        self.feed(Input::Exited { name: name.into(), status: "signal: 9 (SIGKILL)".into() });
    }

    /// The components sent `verb`, in the order sent, from `from` on in the log.
    fn sent(&self, from: usize, verb: Verb) -> Vec<String> {
        self.log[from..].iter().filter(|(_, c)| c.verb() == verb).map(|(n, _)| n.clone()).collect()
    }
}

#[test]
fn launch_starts_every_process_and_waits_until_each_joins() {
    let mut w = World::new(SYSTEM);
    w.auto = false;
    let states = std::mem::take(&mut w.states);
    assert!(states.is_empty());
    let t = w.ask_launch();
    assert!(w.done.contains_key(&t), "every stub joins at once");
    assert_eq!(w.seq.state(), SystemState::Initial);
    // A process that never joins fails the launch, naming it.
    let mut w = World::new(SYSTEM);
    w.ticket += 1;
    let ticket = w.ticket;
    let out = w.seq.handle(Input::Launch { ticket }, w.now);
    assert_eq!(out.len(), 5);
    w.pass(Duration::from_secs(21));
    let e = w.done.remove(&ticket).unwrap().unwrap_err().to_string();
    assert!(e.contains("launch: did not join the control plane within 20 s"), "{e}");
}

#[test]
fn configure_goes_in_dependency_order_with_references_resolved() {
    let mut w = World::launched();
    let r = w.run(Transition::Configure).unwrap();
    let TransitionResult::Configured(infos) = r else { panic!("{r:?}") };
    assert_eq!(infos.len(), 5);
    let order = w.sent(0, Verb::Configure);
    let pos = |n: &str| order.iter().position(|x| x == n).unwrap();
    assert!(pos("evm") < pos("bu-0") && pos("evm") < pos("ru-0"), "{order:?}");
    let evm_listen = infos["evm"]["listen"].as_str().unwrap().to_owned();
    let ru_config = w.log.iter().find_map(|(n, c)| match c {
        Command::Configure { config: Some(t) } if n == "ru-0" => Some(t.clone()),
        _ => None,
    });
    assert_eq!(ru_config.unwrap()["evm"].as_str(), Some(evm_listen.as_str()));
    assert_eq!(w.seq.state(), SystemState::Configured);
    // Twice: refused with the state.
    let e = w.run(Transition::Configure).unwrap_err();
    assert_eq!(e.to_string(), "cannot configure the system in state Configured");
}

#[test]
fn parameters_set_while_initial_reach_the_next_configure_and_the_run_record() {
    let mut w = World::launched();
    let set = |w: &mut World, component: &str, key: &str, value: Option<toml::Value>| {
        w.ticket += 1;
        let ticket = w.ticket;
        w.feed(Input::Set { ticket, component: component.into(), key: key.into(), value });
        w.done.remove(&ticket).expect("answered at once")
    };
    set(&mut w, "ru-0", "streams", Some(toml::Value::Integer(4))).unwrap();
    set(&mut w, "ru-0", "size.mean", Some(toml::Value::Float(2048.0))).unwrap();
    set(&mut w, "bu-0", "directory", Some(toml::Value::String("/tmp/x".into()))).unwrap();
    set(&mut w, "bu-0", "directory", None).unwrap();
    assert_eq!(
        w.seq.snapshot().overrides,
        BTreeMap::from([("ru-0.size.mean".to_owned(), json!(2048.0)), ("ru-0.streams".to_owned(), json!(4))])
    );
    // Unknown components, empty keys and keys through a value that is not a table: refused.
    let e = set(&mut w, "ru-9", "streams", Some(toml::Value::Integer(1))).unwrap_err().to_string();
    assert!(e.contains("no component `ru-9`") && e.contains("ru-0"), "{e}");
    let e = set(&mut w, "ru-0", "size..mean", Some(toml::Value::Integer(1))).unwrap_err().to_string();
    assert!(e.contains("not a parameter name"), "{e}");
    let e = set(&mut w, "ru-0", "evm.port", Some(toml::Value::Integer(1))).unwrap_err().to_string();
    assert!(e.contains("`ru-0.evm` is not a table"), "{e}");

    w.run(Transition::Configure).unwrap();
    let ru_config = w.log.iter().find_map(|(n, c)| match c {
        Command::Configure { config: Some(t) } if n == "ru-0" => Some(t.clone()),
        _ => None,
    });
    let ru_config = ru_config.unwrap();
    assert_eq!(ru_config["streams"].as_integer(), Some(4));
    assert_eq!(ru_config["size"]["mean"].as_float(), Some(2048.0));
    assert!(ru_config["evm"].as_str().is_some_and(|a| !a.contains("${")), "references still resolved");
    let bu_config = w.log.iter().find_map(|(n, c)| match c {
        Command::Configure { config: Some(t) } if n == "bu-0" => Some(t.clone()),
        _ => None,
    });
    assert!(!bu_config.unwrap().contains_key("directory"), "taken back");
    // Configured: a parameter that is not live is refused by the component, saying why.
    let e = set(&mut w, "ru-0", "streams", Some(toml::Value::Integer(2))).unwrap_err().to_string();
    assert!(e.contains("ru-0: `streams` cannot change after configure"), "{e}");
    // The run's record holds what was set.
    w.run(Transition::Start { run: None }).unwrap();
    w.run(Transition::Stop).unwrap();
    assert_eq!(w.closed.last().unwrap().overrides, w.seq.snapshot().overrides);
    assert_eq!(w.closed.last().unwrap().overrides.len(), 2);
}

#[test]
fn start_goes_stage_by_stage_consumers_first() {
    let mut w = World::launched();
    w.run(Transition::Configure).unwrap();
    w.auto = false;
    let mark = w.log.len();
    let t = w.ask(Transition::Start { run: None });
    // Stage by stage: the recorder (2) alone first.
    assert_eq!(w.sent(mark, Verb::Start), vec!["rec"]);
    w.reply_all();
    assert_eq!(w.sent(mark, Verb::Start), vec!["rec", "evm"]);
    w.reply_all();
    w.reply_all();
    w.reply_all();
    w.reply_all();
    assert_eq!(w.sent(mark, Verb::Start), vec!["rec", "evm", "bu-0", "ru-0", "src"]);
    assert!(matches!(w.done.remove(&t), Some(Ok(TransitionResult::Started(1)))));
    assert_eq!(w.seq.state(), SystemState::Running);
    assert!(w.seq.run_open());
}

#[test]
fn a_start_that_fails_stops_what_started_and_closes_the_run_as_failed() {
    let mut w = World::launched();
    w.run(Transition::Configure).unwrap();
    w.refuse.push(("ru-0".into(), Verb::Start));
    let mark = w.log.len();
    let e = w.run(Transition::Start { run: Some(7) }).unwrap_err();
    assert_eq!(e.to_string(), "ru-0: start: start refused");
    // The source (a later stage) was never started; what started is stopped, producers first.
    assert!(!w.sent(mark, Verb::Start).contains(&"src".to_owned()));
    assert_eq!(w.sent(mark, Verb::Stop), vec!["evm", "bu-0", "rec"]);
    let c = w.closed.last().unwrap();
    assert_eq!((c.run, c.errors.clone()), (7, vec!["ru-0: start: start refused".to_owned()]));
    assert!(!w.seq.run_open());
    assert_eq!(w.seq.snapshot().last_error.as_deref(), Some("ru-0: start: start refused"));
}

#[test]
fn pause_goes_producers_first_and_stop_resolves_stop_arg_from_earlier_summaries() {
    let mut w = World::launched();
    w.run(Transition::Configure).unwrap();
    w.run(Transition::Start { run: None }).unwrap();
    let mark = w.log.len();
    let t = w.ask(Transition::Pause);
    assert!(matches!(w.done.remove(&t), Some(Ok(_))));
    let order = w.sent(mark, Verb::Pause);
    assert_eq!(order.first().map(String::as_str), Some("evm"), "pause: producers first: {order:?}");
    w.run(Transition::Resume).unwrap();
    let mark = w.log.len();
    let r = w.run(Transition::Stop).unwrap();
    let TransitionResult::Stopped(summary) = r else { panic!() };
    assert_eq!(summary.state, RunState::Stopped);
    assert_eq!(w.sent(mark, Verb::Stop), vec!["evm", "src", "ru-0", "bu-0", "rec"]);
    let src_stop = w.log[mark..].iter().find(|(n, _)| n == "src").map(|(_, c)| c.clone());
    assert_eq!(src_stop, Some(Command::Stop { last_event: Some(42) }), "the EVM's last_event");
    let c = w.closed.last().unwrap();
    assert_eq!(
        c.components
            .iter()
            .find(|r| r.name == "evm")
            .unwrap()
            .summary
            .as_ref()
            .unwrap()
            .trigger
            .as_ref()
            .unwrap()
            .triggered,
        10
    );
    assert_eq!(w.seq.state(), SystemState::Configured);
}

#[test]
fn a_stop_from_paused_resumes_all_but_the_trigger_first_so_that_what_it_triggered_is_read_out() {
    let mut w = World::launched();
    w.run(Transition::Configure).unwrap();
    let mark = w.log.len();
    w.run(Transition::Start { run: None }).unwrap();
    let start_order = w.sent(mark, Verb::Start);
    w.run(Transition::Pause).unwrap();
    assert_eq!(w.seq.state(), SystemState::Paused);
    let mark = w.log.len();
    let t = w.ask(Transition::Stop);
    let TransitionResult::Stopped(summary) = w.done.remove(&t).unwrap().unwrap() else { panic!() };
    assert_eq!(summary.state, RunState::Stopped);
    // Consumers first, every component but the EVM (the paused sources hold what the builders
    // wait for); then the stop, producers first, the sources told the EVM's last event.
    let resumed: Vec<String> = start_order.into_iter().filter(|n| n != "evm").collect();
    assert_eq!(w.sent(mark, Verb::Resume), resumed);
    assert_eq!(w.sent(mark, Verb::Stop), vec!["evm", "src", "ru-0", "bu-0", "rec"]);
    let first_stop = w.log[mark..].iter().position(|(_, c)| c.verb() == Verb::Stop).unwrap();
    assert_eq!(w.sent(mark + first_stop, Verb::Resume), Vec::<String>::new(), "every resume before the stop");
    let src_stop = w.log[mark..].iter().find(|(n, c)| n == "src" && c.verb() == Verb::Stop).map(|(_, c)| c.clone());
    assert_eq!(src_stop, Some(Command::Stop { last_event: Some(42) }));
    assert_eq!(w.seq.state(), SystemState::Configured);
}

#[test]
fn a_component_that_never_answers_fails_the_transition_after_the_timeout() {
    let mut w = World::launched();
    w.silent.push("ru-0".into());
    let t = w.ask(Transition::Configure);
    assert!(!w.done.contains_key(&t));
    w.pass(Duration::from_secs(19));
    assert!(!w.done.contains_key(&t));
    assert_eq!(w.seq.state(), SystemState::Configuring);
    w.pass(Duration::from_secs(2));
    let e = w.done.remove(&t).unwrap().unwrap_err();
    assert_eq!(
        e.to_string(),
        "ru-0: configure: no answer within 20 s; see logs/ru-0.log (configure undone: rec, evm, bu-0 reset to \
         Initial, ru-0 told to reset once it is done; configure again)"
    );
    // A late answer finds nobody waiting and changes nothing.
    w.silent.clear();
    w.reply_all();
    assert!(w.done.is_empty());
}

#[test]
fn an_operator_that_did_not_run_gives_what_it_waits_for_a_full_timeout_with_it_running() {
    let mut w = World::launched();
    w.silent.push("ru-0".into());
    let t = w.ask(Transition::Configure);
    w.pass(Duration::from_secs(5));
    // The operator is stopped for 30 s (its timeout is 20 s): on resuming, it says so first.
    w.now = w.now.after(Duration::from_secs(30));
    w.feed(Input::Stalled(Duration::from_secs(30)));
    w.feed(Input::Tick);
    assert!(!w.done.contains_key(&t), "configure failed at once after the operator's own stall");
    w.pass(Duration::from_secs(14));
    assert!(!w.done.contains_key(&t));
    w.pass(Duration::from_secs(2));
    let e = w.done.remove(&t).unwrap().unwrap_err().to_string();
    assert!(e.starts_with("ru-0: configure: no answer within 20 s"), "{e}");
}

#[test]
fn a_configure_that_times_out_is_undone_and_configure_or_reset_work_at_once() {
    let mut w = World::launched();
    w.silent.push("bu-0".into());
    let t = w.ask(Transition::Configure);
    w.pass(Duration::from_secs(21));
    let e = w.done.remove(&t).unwrap().unwrap_err();
    // The one that did not answer is named, with its log.
    assert!(
        matches!(&e, OperatorError::Component { component, command, reason }
            if component == "bu-0" && command == "configure" && reason.starts_with("no answer within 20 s; see logs/bu-0.log")),
        "{e:?}"
    );
    // Those it configured were reset at once (stop order), the silent one told to reset too.
    let resets: Vec<String> = w.log.iter().filter(|(_, c)| *c == Command::Reset).map(|(n, _)| n.clone()).collect();
    assert_eq!(resets, vec!["evm", "bu-0", "rec"]);
    assert_eq!(w.seq.state(), SystemState::Initial, "not Mixed");
    // Configure works at once; the silent one answers its old requests first (configure,
    // reset), then the new one.
    w.silent.clear();
    assert!(matches!(w.run(Transition::Configure), Ok(TransitionResult::Configured(_))));
    assert_eq!(w.seq.state(), SystemState::Configured);
    // So does reset, from the same place.
    let mut w = World::launched();
    w.silent.push("ru-0".into());
    let t = w.ask(Transition::Configure);
    w.pass(Duration::from_secs(21));
    assert!(w.done.remove(&t).unwrap().is_err());
    w.silent.clear();
    w.run(Transition::Reset).unwrap();
    assert_eq!(w.seq.state(), SystemState::Initial);
    w.run(Transition::Configure).unwrap();
}

#[test]
fn a_configure_refused_or_failed_is_undone_and_says_so() {
    for (refuse, fail) in [(true, false), (false, true)] {
        let mut w = World::launched();
        if refuse {
            w.refuse.push(("ru-0".into(), Verb::Configure));
        }
        if fail {
            w.fail.push(("ru-0".into(), Verb::Configure));
        }
        let e = w.run(Transition::Configure).unwrap_err().to_string();
        let why = if refuse { "configure refused" } else { "configure failed" };
        assert_eq!(
            e,
            format!(
                "ru-0: configure: {why} (configure undone: rec, evm, bu-0, ru-0 reset to Initial; configure again)"
            )
        );
        assert_eq!(w.seq.state(), SystemState::Initial, "refuse {refuse}, fail {fail}");
        w.refuse.clear();
        w.fail.clear();
        w.run(Transition::Configure).unwrap();
    }
    // A reference with no value fails before anything is sent to the component.
    let text = SYSTEM.replace(
        "evm = \"${evm.listen}\"\n[[component]]\nname = \"ru-0\"",
        "evm = \"${evm.nowhere}\"\n[[component]]\nname = \"ru-0\"",
    );
    let mut w = World::new(&text);
    let t = w.ask_launch();
    assert!(matches!(w.done.remove(&t), Some(Ok(_))));
    let e = w.run(Transition::Configure).unwrap_err().to_string();
    assert!(e.starts_with("bu-0: configure: `${evm.nowhere}`: evm gave no `nowhere`"), "{e}");
    assert!(e.ends_with("(configure undone: rec, evm reset to Initial; configure again)"), "{e}");
    assert_eq!(w.seq.state(), SystemState::Initial);
}

#[test]
fn a_late_reset_nobody_took_is_sent_again_and_its_component_counts_as_initial_until_it_answers() {
    let mut w = World::launched();
    w.silent.push("bu-0".into());
    let t = w.ask(Transition::Configure);
    w.pass(Duration::from_secs(21));
    assert!(w.done.remove(&t).unwrap().is_err());
    // bu-0 was off the control plane (declared lost while it did not run): nobody took the
    // reset it was told to do once it is done, and the job that sent it is over.
    let (&reset, _) =
        w.inbox.iter().rev().find(|(_, (n, r))| n == "bu-0" && r.command == Command::Reset).expect("the late reset");
    w.feed(Input::Undelivered { id: reset });
    // It comes back having done the configure it did not answer in time: not Mixed.
    let mut late = w.status("bu-0");
    late.state = State::Configured;
    w.feed(Input::Status(late));
    assert_eq!(w.seq.state(), SystemState::Initial, "not Mixed while its reset is on the way");
    let mark = w.log.len();
    w.pass(Duration::from_millis(60));
    assert_eq!(w.sent(mark, Verb::Reset), vec!["bu-0"], "the late reset is sent again");
}

#[test]
fn a_request_nobody_took_is_sent_again_until_the_deadline() {
    let mut w = World::launched();
    w.auto = false;
    let t = w.ask(Transition::Configure);
    let (&id, _) = w.inbox.iter().next().unwrap();
    let sends = w.log.len();
    w.feed(Input::Undelivered { id });
    w.pass(Duration::from_millis(60));
    assert_eq!(w.log.len(), sends + 1, "sent again");
    assert_eq!(w.log[sends].0, w.log[sends - 1].0);
    w.feed(Input::Undelivered { id });
    w.pass(Duration::from_secs(25));
    let e = w.done.remove(&t).unwrap().unwrap_err().to_string();
    assert!(e.ends_with("configure: not on the control plane (nothing was configured yet: configure again)"), "{e}");
}

#[test]
fn a_transition_under_way_makes_others_wait_their_turn_or_be_refused() {
    let mut w = World::launched();
    w.auto = false;
    let t1 = w.ask(Transition::Configure);
    let e = w.run(Transition::Reset).unwrap_err();
    assert_eq!(e, OperatorError::Busy("Configuring".into()));
    assert_eq!(w.seq.state(), SystemState::Configuring);
    w.auto = true;
    w.reply_all();
    assert!(matches!(w.done.remove(&t1), Some(Ok(_))));
}

#[test]
fn a_death_in_a_run_stops_it_by_policy_with_the_reason() {
    let mut w = World::launched();
    w.run(Transition::Configure).unwrap();
    w.run(Transition::Start { run: None }).unwrap();
    let mark = w.log.len();
    w.kill("ru-0"); // policy stop (the system's default)
    // The run is stopped without anyone asking, the dead one skipped.
    assert!(!w.sent(mark, Verb::Stop).contains(&"ru-0".to_owned()));
    assert_eq!(w.sent(mark, Verb::Stop), vec!["evm", "src", "bu-0", "rec"]);
    let c = w.closed.last().unwrap();
    assert_eq!(c.errors[0], "ru-0 failed: signal: 9 (SIGKILL)");
    assert!(c.errors.iter().any(|e| e == "ru-0: not running (signal: 9 (SIGKILL))"), "{:?}", c.errors);
    assert_eq!(c.components.iter().find(|r| r.name == "ru-0").unwrap().died.as_deref(), Some("signal: 9 (SIGKILL)"));
    assert!(!w.seq.run_open());
    assert_eq!(w.seq.state(), SystemState::Error, "the dead one is still dead");
    // Reset starts it again first.
    let mark = w.log.len();
    w.run(Transition::Reset).unwrap();
    assert_eq!(w.sent(mark, Verb::Reset).len(), 5);
    assert_eq!(w.seq.state(), SystemState::Initial);
}

#[test]
fn a_restart_brings_the_component_back_into_a_paused_run() {
    let mut w = World::launched();
    w.run(Transition::Configure).unwrap();
    w.run(Transition::Start { run: Some(5) }).unwrap();
    w.feed(Input::Stats { name: "bu-0".into(), stats: Stats::counted(300, 3000) });
    w.run(Transition::Pause).unwrap();
    w.auto = false;
    let mark = w.log.len();
    w.kill("bu-0"); // policy restart
    // Started again at once; joined (the stub publishes Initial), then configured…
    assert_eq!(w.sent(mark, Verb::Configure), vec!["bu-0"]);
    // …and a transition asked for meanwhile waits for it.
    let t = w.ask(Transition::Resume);
    assert!(!w.done.contains_key(&t));
    w.reply_all();
    assert_eq!(w.log[mark + 1].1, Command::Start { run: 5 });
    w.reply_all();
    assert_eq!(w.log[mark + 2].1, Command::Pause);
    // Back in the paused run; then the resume that waited runs, stage by stage.
    w.auto = true;
    w.reply_all();
    let v = w.seq.view("bu-0").unwrap();
    assert_eq!((v.restarts, v.earlier.len()), (1, 1));
    assert_eq!(v.earlier[0].events, 300, "the counters of the life that ended still count");
    assert_eq!(w.sent(mark, Verb::Resume).len(), 5);
    assert!(matches!(w.done.remove(&t), Some(Ok(_))));
    assert_eq!(w.seq.state(), SystemState::Running);
    assert!(w.seq.run_open(), "a restart does not close the run");
}

#[test]
fn a_restart_that_fails_in_a_run_stops_the_run() {
    let mut w = World::launched();
    w.run(Transition::Configure).unwrap();
    w.run(Transition::Start { run: None }).unwrap();
    w.refuse.push(("bu-0".into(), Verb::Configure));
    w.kill("bu-0");
    let c = w.closed.last().expect("the run was stopped");
    assert!(
        c.errors[0].starts_with(
            "bu-0 failed (signal: 9 (SIGKILL)) and could not be restarted: bu-0: configure: configure refused"
        ),
        "{:?}",
        c.errors
    );
}

#[test]
fn once_the_run_must_stop_nothing_is_restarted_into_it_again() {
    // Two components under the restart policy whose restarts fail (their ET system is gone with
    // their host) and one under the stop policy, dead together.
    let text = SYSTEM
        .replace("name = \"rec\"\nkind = \"recorder\"", "name = \"rec\"\nkind = \"recorder\"\npolicy = \"restart\"");
    let mut w = World::new(&text);
    let t = w.ask_launch();
    assert!(matches!(w.done.remove(&t), Some(Ok(_))));
    w.run(Transition::Configure).unwrap();
    w.run(Transition::Start { run: None }).unwrap();
    w.fail.push(("bu-0".into(), Verb::Configure));
    w.fail.push(("rec".into(), Verb::Start));
    let mark = w.log.len();
    w.auto = false;
    w.kill("rec");
    w.kill("bu-0");
    w.kill("ru-0");
    for _ in 0..20 {
        w.reply_all();
        w.pass(Duration::from_millis(100));
    }
    // Each was restarted once; when those restarts failed, the run stopped.
    let configures = w.sent(mark, Verb::Configure);
    assert_eq!(configures.iter().filter(|n| *n == "bu-0").count(), 1, "{configures:?}");
    assert_eq!(configures.iter().filter(|n| *n == "rec").count(), 1, "{configures:?}");
    let c = w.closed.last().expect("the run was stopped");
    assert!(c.errors.iter().any(|e| e.starts_with("bu-0 failed")), "{:?}", c.errors);
    assert!(!w.seq.run_open());
}

#[test]
fn stale_and_foreign_messages_change_nothing() {
    let mut w = World::launched();
    w.run(Transition::Configure).unwrap();
    // An older status of the same life (a lower seq) does not take the state back.
    let mut old = w.status("evm");
    old.seq = 1;
    old.state = State::Initial;
    w.feed(Input::Status(old));
    assert_eq!(w.seq.state(), SystemState::Configured);
    // A reply to a request that does not exist, or from the wrong component, is ignored.
    let status = w.status("evm");
    let stray = CommandReply { id: 999, command: Verb::Start, status, outcome: Outcome::Ok(Answer::Run(1)) };
    w.feed(Input::Reply(stray));
    assert_eq!(w.seq.state(), SystemState::Configured);
    // The statistics of a process that has not joined yet are the old life's.
    w.feed(Input::Stats { name: "nobody".into(), stats: Stats::counted(1, 1) });
}

#[test]
fn a_forged_status_neither_of_another_incarnation_nor_numbered_far_ahead_wedges_the_system() {
    let mut w = World::launched();
    w.run(Transition::Configure).unwrap();
    let shown = |w: &World| w.seq.view("evm").map(|v| v.shown());
    // Another incarnation's status (a forger's, or an earlier life's) is not taken.
    let mut forged = w.status("evm");
    forged.incarnation = Some(7);
    forged.seq = 1_000_000_000;
    forged.state = State::Error;
    w.feed(Input::Status(forged.clone()));
    assert_eq!(shown(&w), Some(ComponentState::Configured));
    forged.incarnation = None;
    w.feed(Input::Status(forged.clone()));
    assert_eq!(shown(&w), Some(ComponentState::Configured));
    // The launched incarnation's, numbered far ahead: taken, but the next real status is
    // taken after it, and every transition works.
    forged.incarnation = w.status("evm").incarnation;
    w.feed(Input::Status(forged.clone()));
    assert_eq!(shown(&w), Some(ComponentState::Error));
    let real = w.status("evm");
    w.feed(Input::Status(real));
    assert_eq!(shown(&w), Some(ComponentState::Configured));
    w.run(Transition::Start { run: None }).unwrap();
    assert_eq!(shown(&w), Some(ComponentState::Running));
    w.run(Transition::Stop).unwrap();
    w.run(Transition::Reset).unwrap();
    w.run(Transition::Configure).unwrap();
    assert_eq!(w.seq.state(), SystemState::Configured);
    // An older real status (within the window) is still older.
    let mut old = w.status("evm");
    old.seq -= 3;
    old.state = State::Initial;
    w.feed(Input::Status(old));
    assert_eq!(shown(&w), Some(ComponentState::Configured));
}

#[test]
fn stop_without_a_run_and_reset_during_a_run_are_refused_but_a_broken_run_is_reset_as_failed() {
    let mut w = World::launched();
    let e = w.run(Transition::Stop).unwrap_err().to_string();
    assert_eq!(e, "cannot stop the system in state Initial");
    w.run(Transition::Configure).unwrap();
    w.run(Transition::Start { run: None }).unwrap();
    // A run that goes on ends with a stop, which records it: reset is refused.
    let e = w.run(Transition::Reset).unwrap_err().to_string();
    assert_eq!(e, "cannot reset the system in state Running");
    w.run(Transition::Pause).unwrap();
    let e = w.run(Transition::Reset).unwrap_err().to_string();
    assert_eq!(e, "cannot reset the system in state Paused");
    assert!(w.seq.run_open() && w.closed.is_empty());
    // A system left Mixed with its run open (a component refused to resume): reset closes
    // the run as failed.
    w.refuse.push(("src".into(), Verb::Resume));
    assert!(w.run(Transition::Resume).is_err());
    assert_eq!(w.seq.state(), SystemState::Mixed);
    assert!(w.seq.run_open());
    w.run(Transition::Reset).unwrap();
    let c = w.closed.last().unwrap();
    assert!(c.errors.contains(&"reset during the run".to_owned()), "{:?}", c.errors);
    assert!(c.components.iter().all(|r| r.summary.is_none()));
    assert_eq!(w.seq.state(), SystemState::Initial);
}

#[test]
fn shutdown_resets_every_live_component_and_answers_what_waits() {
    let mut w = World::launched();
    w.run(Transition::Configure).unwrap();
    w.auto = false;
    let t = w.ask(Transition::Start { run: None });
    w.ticket += 1;
    let s = w.ticket;
    w.kill("src");
    let mark = w.log.len();
    w.feed(Input::Shutdown { ticket: s });
    assert!(matches!(w.done.remove(&t), Some(Err(_))), "the start under way is answered");
    assert_eq!(w.sent(mark, Verb::Reset).len(), 4, "the dead one is not asked");
    w.pass(Duration::from_secs(11));
    assert!(matches!(w.done.remove(&s), Some(Ok(_))), "shutdown ends even if nobody answers");
}

mod any_history {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        Ask(usize, Option<u32>),
        Kill(usize),
        Silence(usize),
        Wake,
        Pass(u64),
        AnswerLate,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0usize..6, proptest::option::of(1u32..5)).prop_map(|(t, r)| Step::Ask(t, r)),
            1 => (0usize..5).prop_map(Step::Kill),
            1 => (0usize..5).prop_map(Step::Silence),
            1 => Just(Step::Wake),
            2 => (0u64..30_000).prop_map(Step::Pass),
            1 => Just(Step::AnswerLate),
        ]
    }

    const NAMES: [&str; 5] = ["rec", "evm", "bu-0", "ru-0", "src"];

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

        /// Whatever is asked, whoever dies or falls silent, and however time passes, every
        /// transition asked for is answered, and once every component answers again the
        /// system leaves every phase.
        #[test]
        fn every_transition_is_answered_whatever_happens(steps in proptest::collection::vec(step(), 1..40)) {
            let mut w = World::launched();
            let mut asked = Vec::new();
            for s in steps {
                match s {
                    Step::Ask(t, run) => {
                        let t = match t {
                            0 => Transition::Configure,
                            1 => Transition::Start { run },
                            2 => Transition::Pause,
                            3 => Transition::Resume,
                            4 => Transition::Stop,
                            _ => Transition::Reset,
                        };
                        asked.push(w.ask(t));
                    }
                    Step::Kill(i) => {
                        if w.states.contains_key(NAMES[i]) {
                            w.kill(NAMES[i]);
                        }
                    }
                    Step::Silence(i) => w.silent.push(NAMES[i].to_owned()),
                    Step::Wake => w.silent.clear(),
                    Step::Pass(ms) => w.pass(Duration::from_millis(ms)),
                    Step::AnswerLate => w.reply_all(),
                }
            }
            // Time passes beyond every timeout (restarts included), with everyone answering.
            w.silent.clear();
            for _ in 0..6 {
                w.reply_all();
                w.pass(Duration::from_secs(61));
            }
            for t in asked {
                prop_assert!(w.done.contains_key(&t), "transition {t} never answered");
            }
            let state = w.seq.state();
            prop_assert!(!state.is_phase(), "still in {state}");
        }

        /// Whoever is silent, refuses or fails at configure, and however long it takes: the
        /// configure is answered, the answer names a component that did not make it, the
        /// system is back in Initial (never Mixed), and once everyone answers again both
        /// configure and reset work from there.
        #[test]
        fn a_configure_that_fails_leaves_a_system_that_configures_and_resets(
            fates in proptest::collection::vec(0u8..4, 5),
            wait_ms in 0u64..60_000,
            reset_first in any::<bool>(),
        ) {
            let mut w = World::launched();
            for (name, fate) in NAMES.iter().zip(&fates) {
                match fate {
                    1 => w.silent.push((*name).to_owned()),
                    2 => w.refuse.push(((*name).to_owned(), Verb::Configure)),
                    3 => w.fail.push(((*name).to_owned(), Verb::Configure)),
                    _ => {}
                }
            }
            let failing: Vec<&str> = NAMES.iter().zip(&fates).filter(|(_, f)| **f != 0).map(|(n, _)| *n).collect();
            let t = w.ask(Transition::Configure);
            w.pass(Duration::from_millis(wait_ms));
            w.pass(Duration::from_secs(21));
            w.pass(Duration::from_secs(21));
            let answer = w.done.remove(&t);
            prop_assert!(answer.is_some(), "configure never answered");
            match answer.unwrap() {
                Ok(_) => prop_assert!(failing.is_empty()),
                Err(e) => {
                    let OperatorError::Component { component, .. } = &e else {
                        return Err(TestCaseError::fail(format!("not a component's error: {e:?}")));
                    };
                    prop_assert!(failing.contains(&component.as_str()), "{e} names one that did not fail");
                    prop_assert_eq!(w.seq.state(), SystemState::Initial, "{}", e);
                    w.silent.clear();
                    w.refuse.clear();
                    w.fail.clear();
                    w.reply_all();
                    if reset_first {
                        prop_assert!(w.run(Transition::Reset).is_ok());
                        prop_assert_eq!(w.seq.state(), SystemState::Initial);
                    }
                    let again = w.run(Transition::Configure);
                    prop_assert!(again.is_ok(), "configure again: {:?}", again);
                    prop_assert_eq!(w.seq.state(), SystemState::Configured);
                    prop_assert!(w.run(Transition::Reset).is_ok());
                    prop_assert_eq!(w.seq.state(), SystemState::Initial);
                }
            }
        }
    }
}

/// The system with `extra` in `[system]` and the policy lines changed by `edit`.
fn degraded_system(system_extra: &str, edit: impl Fn(String) -> String) -> World {
    let text = edit(SYSTEM.replace("name = \"sim\"\n", &format!("name = \"sim\"\n{system_extra}\n")));
    let mut w = World::new(&text);
    let t = w.ask_launch();
    assert!(matches!(w.done.remove(&t), Some(Ok(_))), "launched");
    w.run(Transition::Configure).unwrap();
    w.run(Transition::Start { run: None }).unwrap();
    w
}

#[test]
fn restarts_back_off_and_past_the_cap_the_component_stops_the_run() {
    let mut w = degraded_system("restart_max = 2\nrestart_backoff_s = 2.0", |t| t);
    // The first restart is at once.
    let mark = w.log.len();
    w.kill("bu-0");
    assert_eq!(w.sent(mark, Verb::Start), vec!["bu-0"], "back in the run at once");
    // The second waits the back-off: nothing after 1.5 s, back after 2 s.
    let mark = w.log.len();
    w.kill("bu-0");
    w.pass(Duration::from_millis(1500));
    assert!(w.sent(mark, Verb::Configure).is_empty(), "restarted before its back-off");
    assert!(w.seq.next_deadline().is_some_and(|d| d <= w.now.mono + Duration::from_millis(500)));
    w.pass(Duration::from_millis(500));
    assert_eq!(w.sent(mark, Verb::Start), vec!["bu-0"]);
    assert!(w.seq.run_open());
    assert_eq!(w.seq.view("bu-0").unwrap().recent_restarts, 2);
    // The third failure is past the cap: the run stops and says why.
    w.kill("bu-0");
    let c = w.closed.last().expect("the run was stopped");
    assert_eq!(
        c.errors[0], "bu-0 failed: signal: 9 (SIGKILL); not restarted again: 2 restarts, the cap",
        "{:?}",
        c.errors
    );
    assert!(!w.seq.run_open());
    // A reset gives the restarts back.
    w.run(Transition::Reset).unwrap();
    assert_eq!(w.seq.view("bu-0").unwrap().recent_restarts, 0);
}

#[test]
fn an_expendable_component_is_left_out_and_the_run_goes_on() {
    let mut w = degraded_system("", |t| {
        t.replace("name = \"rec\"\nkind = \"recorder\"", "name = \"rec\"\nkind = \"recorder\"\npolicy = \"expendable\"")
    });
    let mark = w.log.len();
    w.kill("rec");
    assert!(w.seq.run_open(), "the run goes on");
    assert!(w.log[mark..].is_empty(), "nothing was sent: {:?}", &w.log[mark..]);
    assert_eq!(w.seq.state(), SystemState::Running, "the system runs, degraded");
    let degraded = w.seq.snapshot().degraded;
    assert_eq!(degraded["rec"], "signal: 9 (SIGKILL) (expendable)");
    // Pause and resume pass it by.
    w.run(Transition::Pause).unwrap();
    w.run(Transition::Resume).unwrap();
    assert!(!w.sent(mark, Verb::Pause).contains(&"rec".to_owned()));
    // The stop is not a failure; the record says whom the run went without.
    let mark = w.log.len();
    let r = w.run(Transition::Stop).unwrap();
    assert!(matches!(r, TransitionResult::Stopped(ref s) if s.error.is_none()), "{r:?}");
    let c = w.closed.last().unwrap();
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    assert_eq!(c.degraded, vec!["rec: signal: 9 (SIGKILL) (expendable)".to_owned()]);
    assert_eq!(c.components.iter().find(|r| r.name == "rec").unwrap().died.as_deref(), Some("signal: 9 (SIGKILL)"));
    // Then it is started again and configured, ready for the next run.
    assert_eq!(w.sent(mark, Verb::Configure), vec!["rec"]);
    assert_eq!(w.seq.state(), SystemState::Configured);
    assert!(w.seq.snapshot().degraded.is_empty());
    w.run(Transition::Start { run: None }).unwrap();
}

#[test]
fn a_group_stops_the_run_only_when_fewer_than_its_minimum_are_left() {
    let two_bus = |t: String| {
        t.replace(
            "[[component]]\nname = \"ru-0\"",
            "[[component]]\nname = \"bu-1\"\nkind = \"bu\"\n[component.params]\nevm = \"${evm.listen}\"\n\n[[component]]\nname = \"ru-0\"",
        )
        .replace("policy = \"restart\"\n", "")
            + "\n[[group]]\nname = \"builders\"\nmembers = [\"bu-0\", \"bu-1\"]\nmin = 1\n"
    };
    let mut w = degraded_system("", two_bus);
    w.kill("bu-0"); // policy stop, but its group keeps 1 of 2
    assert!(w.seq.run_open(), "the run goes on with one builder");
    assert_eq!(
        w.seq.snapshot().degraded["bu-0"],
        "signal: 9 (SIGKILL) (group `builders` keeps 1 of 2 members, its minimum is 1)"
    );
    w.kill("bu-1");
    let c = w.closed.last().expect("the run was stopped");
    assert_eq!(
        c.errors[0],
        "bu-1 failed: signal: 9 (SIGKILL); group `builders` has 0 of its 2 members left, fewer than its minimum 1"
    );
    assert_eq!(c.degraded.len(), 1, "{:?}", c.degraded);
    assert!(!c.errors.iter().any(|e| e.starts_with("bu-0")), "bu-0's death is not the stop's error: {:?}", c.errors);
}

#[test]
fn groups_are_checked_with_their_lines() {
    let text = format!(
        "{SYSTEM}\n[[group]]\nname = \"g\"\nmembers = [\"bu-0\", \"nobody\"]\nmin = 3\n\n[[group]]\nname = \"h\"\nmembers = [\"bu-0\"]\nmin = 1\n"
    );
    let e = SystemFile::parse(&text, &registry()).unwrap_err().to_string();
    assert!(e.contains("`nobody` is not a component"), "{e}");
    assert!(e.contains("min = 3 is out of range: 0 … 2"), "{e}");
    assert!(e.contains("`bu-0` is in group `g` and in group `h`"), "{e}");
    assert!(e.lines().all(|l| l.starts_with("line ")), "{e}");
    let e = SystemFile::parse(&SYSTEM.replace("name = \"sim\"", "name = \"sim\"\nrestart_backoff_s = -1"), &registry())
        .unwrap_err()
        .to_string();
    assert!(e.contains("restart_backoff_s") && e.starts_with("line 4"), "{e}");
}

#[test]
fn live_parameters_reach_the_component_at_once_and_the_run_record() {
    let mut w = World::launched();
    let set = |w: &mut World, component: &str, key: &str, value: Option<toml::Value>| {
        w.ticket += 1;
        let ticket = w.ticket;
        w.feed(Input::Set { ticket, component: component.into(), key: key.into(), value });
        w.done.remove(&ticket)
    };
    w.run(Transition::Configure).unwrap();
    w.run(Transition::Start { run: Some(3) }).unwrap();
    let mark = w.log.len();
    w.now = w.now.after(Duration::from_secs(2));
    set(&mut w, "src", "rate_hz", Some(toml::Value::Integer(500))).expect("answered").unwrap();
    assert_eq!(w.log[mark], ("src".to_owned(), Command::Set { key: "rate_hz".into(), value: json!(500) }));
    // Kept for the next configure, and in the run's record with when it changed.
    assert_eq!(w.seq.snapshot().overrides["src.rate_hz"], json!(500));
    // Refusals: the component's reason; a take-back; a component that is not there.
    let e = set(&mut w, "src", "size", Some(toml::Value::Integer(1))).unwrap().unwrap_err();
    assert!(matches!(e, OperatorError::Invalid(_)), "{e:?}");
    assert!(
        e.to_string().contains("src: `size` cannot change after configure; the live parameters of src are: rate_hz"),
        "{e}"
    );
    let e = set(&mut w, "src", "rate_hz", None).unwrap().unwrap_err().to_string();
    assert!(e.contains("taken back only while Initial"), "{e}");
    w.kill("rec"); // stops the run (policy stop)
    let c = w.closed.last().unwrap();
    assert_eq!(c.changes.len(), 1, "{:?}", c.changes);
    assert_eq!((c.changes[0].component.as_str(), c.changes[0].key.as_str()), ("src", "rate_hz"));
    assert_eq!((c.changes[0].value.clone(), c.changes[0].t_ms), (json!(500), 1_002_000));
    // A dead component takes nothing; nor does a system in Error.
    let e = set(&mut w, "rec", "rate_hz", Some(toml::Value::Integer(1))).unwrap().unwrap_err().to_string();
    assert!(e.contains("it is Error"), "{e}");
    // A component that never answers: the ticket is answered after the timeout.
    w.run(Transition::Reset).unwrap();
    w.run(Transition::Configure).unwrap();
    w.silent.push("src".into());
    w.ticket += 1;
    let ticket = w.ticket;
    w.feed(Input::Set { ticket, component: "src".into(), key: "rate_hz".into(), value: Some(toml::Value::Integer(7)) });
    assert!(!w.done.contains_key(&ticket));
    w.pass(Duration::from_secs(21));
    let e = w.done.remove(&ticket).expect("answered after the timeout").unwrap_err().to_string();
    assert!(e.contains("no answer"), "{e}");
}

#[test]
fn a_published_schema_checks_every_set_before_anything_takes_it() {
    use daqflow_component::schema::{ANY_STATE, Key, Schema};
    let mut w = World::launched();
    let set = |w: &mut World, key: &str, value: toml::Value| {
        w.ticket += 1;
        let ticket = w.ticket;
        w.feed(Input::Set { ticket, component: "src".into(), key: key.into(), value: Some(value) });
        w.done.remove(&ticket).expect("answered")
    };
    // Before its schema is known, a value goes through (the component checks it at configure).
    set(&mut w, "rate_hz", toml::Value::Float(1e300)).unwrap();
    let schema = Schema::new("source")
        .key(Key::float("rate_hz", 0.0, 1e9, "Fragments per second.").unit("Hz").live(ANY_STATE))
        .key(Key::integer("source_id", 0, 100, "The id."));
    w.feed(Input::Schema { name: "src".into(), schema: std::sync::Arc::new(schema) });
    let e = set(&mut w, "rate_hz", toml::Value::Float(1e300)).unwrap_err().to_string();
    assert_eq!(e, "src: `rate_hz` = 1e300 is out of range: 0 … 1000000000 Hz");
    let e = set(&mut w, "rate_hx", toml::Value::Integer(5)).unwrap_err().to_string();
    assert_eq!(e, "src: `rate_hx`: no such key; did you mean `rate_hz`?");
    // A whole number for a number key is kept as a number.
    set(&mut w, "rate_hz", toml::Value::Integer(500)).unwrap();
    assert_eq!(w.seq.snapshot().overrides["src.rate_hz"], json!(500.0));
    // While configured: a key that is not live is refused by the operator, not sent.
    w.run(Transition::Configure).unwrap();
    let mark = w.log.len();
    let e = set(&mut w, "source_id", toml::Value::Integer(3)).unwrap_err().to_string();
    assert!(
        e.starts_with("src: `source_id` cannot change after configure; the live parameters of src are: rate_hz"),
        "{e}"
    );
    let e = set(&mut w, "rate_hz", toml::Value::Integer(-1)).unwrap_err().to_string();
    assert_eq!(e, "src: `rate_hz` = -1 is out of range: 0 … 1000000000 Hz");
    assert_eq!(w.log.len(), mark, "nothing was sent");
}

#[test]
fn transitions_asked_during_a_restart_back_off_wait_for_it_and_are_answered() {
    // Found by `any_history`: a component killed twice (its second restart backs off) while
    // transitions are asked for.
    let mut w = World::launched();
    w.kill("bu-0");
    w.kill("bu-0");
    let asked: Vec<u64> = (0..10).map(|_| w.ask(Transition::Configure)).collect();
    assert!(asked.iter().all(|t| !w.done.contains_key(t)), "they wait for the restart");
    for _ in 0..6 {
        w.reply_all();
        w.pass(Duration::from_secs(61));
    }
    for t in asked {
        assert!(w.done.contains_key(&t), "transition {t} never answered");
    }
    assert_eq!(w.seq.state(), SystemState::Configured);
}

/// The live counters of a writer throttled by its disk for `seconds`, in run `run`.
fn throttled(run: u32, seconds: f64) -> Stats {
    let detail = json!({
        "throttled": true, "throttled_for_s": seconds, "throttled_s": seconds,
        "disk_free_bytes": 1u64 << 20, "disk_used_pct": 96.0
    });
    Stats { detail, run: Some(run), ..Stats::counted(500, 5000) }
}

#[test]
fn a_writer_throttled_longer_than_disk_full_stop_s_stops_the_run_producers_first_as_disk_full() {
    let text = SYSTEM.replace("name = \"sim\"", "name = \"sim\"\ndisk_full_stop_s = 20");
    let mut w = World::new(&text);
    let t = w.ask_launch();
    assert!(matches!(w.done.remove(&t), Some(Ok(_))));
    w.run(Transition::Configure).unwrap();
    w.run(Transition::Start { run: Some(7) }).unwrap();
    // Throttled, not yet for long: the run goes on. The counters of another run do not count.
    w.feed(Input::Stats { name: "rec".into(), stats: throttled(7, 19.0) });
    w.feed(Input::Stats { name: "bu-0".into(), stats: throttled(6, 300.0) });
    let mark = w.log.len();
    w.pass(Duration::from_secs(1));
    assert!(w.sent(mark, Verb::Stop).is_empty(), "stopped too early");
    assert_eq!(w.seq.state(), SystemState::Running);
    // Past the limit: the normal stop, producers first, and the run's record says why.
    w.feed(Input::Stats { name: "rec".into(), stats: throttled(7, 20.5) });
    w.pass(Duration::from_secs(1));
    assert_eq!(w.sent(mark, Verb::Stop), vec!["evm", "src", "ru-0", "bu-0", "rec"]);
    assert_eq!(w.seq.state(), SystemState::Configured);
    let closed = w.closed.last().unwrap();
    assert_eq!(closed.run, 7);
    assert_eq!(closed.errors.len(), 1, "{:?}", closed.errors);
    let e = &closed.errors[0];
    assert!(e.starts_with("disk full: `rec` was throttled") && e.contains("for 20 s"), "{e}");
    assert!(e.contains("disk_full_stop_s = 20") && e.contains("1.0 MiB free, 96.0 % used"), "{e}");
    // A recorder whose kind declares no reserve is told nothing more.
    assert!(w.sent(mark, Verb::Set).is_empty(), "{:?}", &w.log[mark..]);
    assert!(!e.contains("reserve"), "{e}");
    // One that has a reserve is told to drain into it before the producers stop, so that
    // what is in flight drains through ET.
    let text = SYSTEM
        .replace("name = \"sim\"", "name = \"sim\"\ndisk_full_stop_s = 20")
        .replace("kind = \"recorder\"", "kind = \"reserve-recorder\"");
    let mut w = World::new(&text);
    let t = w.ask_launch();
    assert!(matches!(w.done.remove(&t), Some(Ok(_))));
    w.run(Transition::Configure).unwrap();
    w.run(Transition::Start { run: Some(7) }).unwrap();
    let mark = w.log.len();
    w.feed(Input::Stats { name: "rec".into(), stats: throttled(7, 20.5) });
    w.pass(Duration::from_secs(1));
    assert_eq!(
        w.log[mark],
        ("rec".to_owned(), Command::Set { key: DRAIN_INTO_RESERVE_KEY.into(), value: json!(true) }),
        "{:?}",
        &w.log[mark..]
    );
    assert_eq!(w.sent(mark, Verb::Set), vec!["rec"]);
    assert_eq!(w.sent(mark, Verb::Stop), vec!["evm", "src", "ru-0", "bu-0", "rec"]);
    assert_eq!(w.seq.state(), SystemState::Configured);
    let e = &w.closed.last().unwrap().errors[0];
    assert!(e.starts_with("disk full: `rec` was throttled") && e.contains("producers first"), "{e}");
    assert!(
        e.ends_with("`rec` was told to write what was in flight into its disk's reserve above throttle_high_pct"),
        "{e}"
    );
    // A stop by hand while it is throttled (not yet for long) tells it the same; the key is
    // the operator's, not for `set`.
    w.run(Transition::Start { run: Some(8) }).unwrap();
    w.ticket += 1;
    let ticket = w.ticket;
    let key = DRAIN_INTO_RESERVE_KEY.to_owned();
    w.feed(Input::Set { ticket, component: "rec".into(), key, value: Some(toml::Value::Boolean(true)) });
    let e = w.done.remove(&ticket).expect("answered").unwrap_err().to_string();
    assert!(e.contains("is set by the operator, not by `set`"), "{e}");
    w.feed(Input::Stats { name: "rec".into(), stats: throttled(8, 2.0) });
    let mark = w.log.len();
    w.pass(Duration::from_secs(1));
    assert!(w.log[mark..].is_empty(), "{:?}", &w.log[mark..]);
    w.run(Transition::Stop).unwrap();
    assert_eq!(w.sent(mark, Verb::Set), vec!["rec"]);
    assert_eq!(w.sent(mark, Verb::Stop), vec!["evm", "src", "ru-0", "bu-0", "rec"]);
    assert!(matches!(&w.log[mark].1, Command::Set { key, .. } if key == DRAIN_INTO_RESERVE_KEY), "{:?}", w.log[mark]);
    assert!(w.closed.last().unwrap().errors.is_empty(), "{:?}", w.closed.last().unwrap().errors);
    // Not throttled: a stop tells it nothing.
    w.run(Transition::Start { run: Some(9) }).unwrap();
    w.feed(Input::Stats { name: "rec".into(), stats: Stats { run: Some(9), ..Stats::counted(5, 50) } });
    let mark = w.log.len();
    w.run(Transition::Stop).unwrap();
    assert!(w.sent(mark, Verb::Set).is_empty(), "{:?}", &w.log[mark..]);
    // Paused, or with the limit 0, nothing is stopped.
    let text = SYSTEM.replace("name = \"sim\"", "name = \"sim\"\ndisk_full_stop_s = 0");
    let mut w = World::new(&text);
    let t = w.ask_launch();
    assert!(matches!(w.done.remove(&t), Some(Ok(_))));
    w.run(Transition::Configure).unwrap();
    w.run(Transition::Start { run: Some(8) }).unwrap();
    w.feed(Input::Stats { name: "rec".into(), stats: throttled(8, 1000.0) });
    let mark = w.log.len();
    w.pass(Duration::from_secs(1));
    assert!(w.sent(mark, Verb::Stop).is_empty());
}
