"""The host agent's stop and preemption notices (workers/agent.py): read from the bus on a thread of
their own, applied by the loop at its next turn."""

from __future__ import annotations

import time

from scheduler import bus
from workers.agent_base import log
from workers.agent_lease import LeaseSync


class StopListener(LeaseSync):
    """Notices from the bus that the control plane ended or is preempting an attempt."""

    def _listen(self) -> None:
        """Stop notices from the bus, on a thread of its own (a blocking read)."""
        prefix = f"{self.name} "
        while not self._done.is_set():
            try:
                client = self._redis()
                stop_channel, preempt_channel = (
                    bus.scoped(bus.STOP_CHANNEL, client), bus.scoped(bus.PREEMPT_CHANNEL, client)
                )  # fmt: skip
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(stop_channel, preempt_channel)
                while not self._done.is_set():
                    msg = pubsub.get_message(timeout=1.0)
                    if msg is None:
                        continue
                    data = msg.get("data")
                    text = data.decode() if isinstance(data, bytes) else str(data)
                    channel = msg.get("channel")
                    channel = channel.decode() if isinstance(channel, bytes) else str(channel)
                    if channel == preempt_channel and text.startswith(prefix):
                        try:
                            attempt_id, window, *why = text[len(prefix) :].split(maxsplit=2)
                            self._preempt_notices.append((int(attempt_id), float(window), "".join(why)))
                        except ValueError:
                            continue
                        self._wake.set()
                    elif text.startswith(prefix):
                        try:
                            self._stop_notices.append(int(text[len(prefix) :]))
                        except ValueError:
                            continue
                        self._wake.set()
            except Exception as exc:
                # The database look every IPUCLOUD_AGENT_SYNC_S still catches every stop.
                log.debug("agent %s: stop notices unavailable (%s)", self.name, exc)
                time.sleep(1.0)

    def _apply_stop_notices(self) -> None:
        while self._stop_notices:
            self._forget(self._stop_notices.popleft())
        while self._preempt_notices:
            self._warn(*self._preempt_notices.popleft())
