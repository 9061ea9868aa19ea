//! The safety state kept beside the change log (PROTOCOL.md §3): written, reopened, read back.
use super::*;

on_both_engines!(safety_state_survives_reopen,);

async fn safety_state_survives_reopen(store: Store) {
    let rec = |n: u64, at: i64| RecordedWatermark {
        watermark: w(n),
        replica: "s3".into(),
        backed_up_ms: at,
    };
    {
        let log = store.open().await;
        assert_eq!(log.load_state().await.unwrap(), SafetyState::default());
        log.save_state(StateChange::CleanupDelay(Duration::from_secs(45)))
            .await
            .unwrap();
        log.save_state(StateChange::Recorded(vec![
            rec(10, 1),
            rec(20, 2),
            rec(30, 3),
        ]))
        .await
        .unwrap();
        // A second sighting keeps the first backup time.
        log.save_state(StateChange::Recorded(vec![rec(30, 99)]))
            .await
            .unwrap();
        log.save_state(StateChange::Scheduled(w(20))).await.unwrap();
        log.save_state(StateChange::ReservationOpened(StoredReservation {
            task_id: "t1".into(),
            started_ms: 5,
        }))
        .await
        .unwrap();
        log.save_state(StateChange::ReservationOpened(StoredReservation {
            task_id: "t2".into(),
            started_ms: 6,
        }))
        .await
        .unwrap();
        log.save_state(StateChange::ReservationEnded("t2".into()))
            .await
            .unwrap();
    }
    let log = store.open().await;
    assert_eq!(
        log.load_state().await.unwrap(),
        SafetyState {
            cleanup_delay: Some(Duration::from_secs(45)),
            last_scheduled: Some(w(20)),
            recorded: vec![rec(30, 3)],
            scheduled: vec![w(20)],
            reservations: vec![StoredReservation {
                task_id: "t1".into(),
                started_ms: 5
            }],
        }
    );
}
