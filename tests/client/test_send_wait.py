from rabbitflow._flow import SendDelayed, SendFailed, SendWait


def notices(wait: SendWait, until: float, step: float = 0.25) -> list[int]:
    seen: list[int] = []
    t = wait.start
    while t <= until:
        result = wait.poll(t)
        seen += [n.seconds for n in result.notices]
        if result.failed:
            break
        t += step
    return seen


def test_default_period_warns_at_5_10_15_seconds() -> None:
    wait = SendWait(100.0, notify_period_ms=5000, wait_failure_ms=60000)
    assert notices(wait, 116.0) == [5, 10, 15]


def test_warnings_stop_before_the_failure() -> None:
    wait = SendWait(0.0, notify_period_ms=1000, wait_failure_ms=3000)
    assert notices(wait, 10.0) == [1, 2]


def test_fails_at_the_wait_failure_time() -> None:
    wait = SendWait(0.0, notify_period_ms=1000, wait_failure_ms=3000)
    assert wait.poll(2.999).failed is None
    assert wait.poll(3.0).failed == SendFailed(3000)


def test_zero_wait_failure_fails_at_once() -> None:
    assert SendWait(5.0, notify_period_ms=5000, wait_failure_ms=0).poll(5.0).failed == SendFailed(0)


def test_late_poll_reports_every_missed_period_once() -> None:
    wait = SendWait(0.0, notify_period_ms=1000, wait_failure_ms=60000)
    assert wait.poll(3.5).notices == (SendDelayed(1000), SendDelayed(2000), SendDelayed(3000))
    assert wait.poll(3.6).notices == ()


def test_wake_at_is_the_next_notice_or_the_failure() -> None:
    wait = SendWait(0.0, notify_period_ms=1000, wait_failure_ms=2500)
    assert wait.poll(0.0).wake_at == 1.0
    assert wait.poll(2.1).wake_at == 2.5


def test_zero_notify_period_only_fails() -> None:
    wait = SendWait(0.0, notify_period_ms=0, wait_failure_ms=2000)
    assert wait.poll(1.9).notices == ()
    assert wait.poll(1.9).wake_at == 2.0


def test_delayed_seconds_are_whole_seconds() -> None:
    assert SendDelayed(1500).seconds == 1
