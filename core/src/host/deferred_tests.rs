//! The deferred-work facility through the path a plugin takes: `HostApi::defer`
//! on the host's services, and the end of the run through `PluginHost::run_end`.

use std::{
    collections::BTreeMap,
    sync::{mpsc, Arc},
    time::Duration,
};

use super::super::{watchdog::Watched, HostServices, Instance, LoadedInfo, PluginHost, RunEndData, Runner};
use crate::{config::KeyOrigins, dist::SingleRank, schedule::Gate};

/// A host with one (not instantiated) plugin `p`, whose jobs the tests defer;
/// `shutdown`: how long the plugin's own wait may last.
fn host(shutdown: Duration) -> (PluginHost, Arc<HostServices>) {
    let services = HostServices::new(Arc::new(Gate::new(0)), Arc::new(SingleRank), shutdown);
    let (mut host, _) = PluginHost::load(&[], &BTreeMap::new(), &KeyOrigins::default(), services.clone(), 0).unwrap();
    host.instances.push(Instance {
        info: LoadedInfo { name: "p".into(), version: "0".into(), path: "p".into(), threading: "inline", critical: false, reward: false },
        runner: Runner::Absent,
        failed: false,
        detached: None,
        declared: 0,
        finish_timeout: Duration::from_secs(60),
        hook_warn: Duration::from_secs(60),
        watched: Watched::new("p", Duration::from_secs(60), None, None),
    });
    (host, services)
}

fn end(host: &mut PluginHost, shutdown: Duration) {
    let end = RunEndData { step: 7, exit_code: 0, wall_s: 0.0, scalars: Vec::new() };
    host.run_end(end, shutdown, &|| false);
}

#[test]
fn jobs_run_in_order_off_the_calling_thread() {
    let (mut host, services) = host(Duration::from_secs(60));
    let (send, ran) = mpsc::channel();
    for i in 0..3 {
        let send = send.clone();
        services.api().defer("p", move || {
            send.send((i, std::thread::current().name().map(str::to_string))).unwrap();
            Ok(())
        });
    }
    assert!(services.api().wait_deferred("p"), "the jobs ran");
    let ran: Vec<_> = ran.try_iter().collect();
    let here = std::thread::current().name().map(str::to_string);
    assert_eq!(ran.iter().map(|r| r.0).collect::<Vec<_>>(), [0, 1, 2], "in the order handed over");
    for (_, thread) in &ran {
        assert_eq!(thread.as_deref(), Some("ptrain-deferred"));
        assert_ne!(thread, &here, "not on the thread that deferred it");
    }
    end(&mut host, Duration::from_secs(60));
    assert!(host.abandoned().is_empty() && host.failures().is_empty());
}

#[test]
fn a_hanging_job_is_given_up_at_the_bound_and_reported() {
    let (mut host, services) = host(Duration::from_millis(50));
    let (release, hang) = mpsc::channel::<()>();
    services.api().defer("p", move || {
        let _ = hang.recv();
        Ok(())
    });
    services.api().defer("p", || Ok(()));
    assert!(!services.api().wait_deferred("p"), "the plugin's own wait is bounded too");
    end(&mut host, Duration::from_millis(50));
    assert_eq!(host.abandoned().get("p"), Some(&2), "the hanging job and the one behind it");
    drop(release);
}

#[test]
fn a_failing_or_panicking_job_is_the_plugins_failure_and_the_thread_goes_on() {
    let (mut host, services) = host(Duration::from_secs(60));
    services.api().defer("p", || panic!("boom"));
    services.api().defer("p", || Err("disk full".into()));
    let (send, ran) = mpsc::channel();
    services.api().defer("p", move || {
        send.send(()).unwrap();
        Ok(())
    });
    end(&mut host, Duration::from_secs(60));
    ran.try_recv().expect("the job after the panic ran");
    let errors: Vec<_> = host.failures().iter().map(|f| (f.plugin.as_str(), f.hook.as_str(), f.step, f.error.as_str())).collect();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors[0].3.contains("boom") && errors[1].3 == "disk full", "{errors:?}");
    assert!(errors.iter().all(|e| e.0 == "p" && e.1 == "deferred" && e.2 == 7), "{errors:?}");
    assert!(host.abandoned().is_empty());
}

#[test]
fn the_services_go_with_the_last_holder_a_job_still_to_run_included() {
    let (host, services) = host(Duration::from_secs(60));
    let gone = Arc::downgrade(&services);
    let (release, hold) = mpsc::channel::<()>();
    services.api().defer("p", move || {
        let _ = hold.recv();
        Ok(())
    });
    drop((host, services));
    assert!(gone.upgrade().is_some(), "the job still to run keeps the services it may call");
    drop(release);
    // The job returns at once now; the services go with it, on the deferred thread.
    let start = std::time::Instant::now();
    while gone.upgrade().is_some() {
        assert!(start.elapsed() < Duration::from_secs(60), "the services outlived their last holder: leaked");
        std::thread::sleep(Duration::from_millis(5));
    }
}
