"""A learner that restarted alone takes the run back to its checkpoint: groups of the lost timeline are
dead-lettered, N_r and the prompt cursor are computed from what survives, late groups of expired leases are
kept out."""

from asyncrl.core.buffer import make_buffer
from asyncrl.core.config.schema import BufferConfig
from asyncrl.core.runtime.events import MemoryEvents
from asyncrl.learner.timeline import rejoin
from asyncrl.v1 import controller_pb2
from tests.buffer_contract import group


class FakeController:
    def __init__(self, cursor_floor: int):
        self.requests, self.cursor_floor = [], cursor_floor

    def ResetTimeline(self, request, timeout=None):
        self.requests.append(request)
        return controller_pb2.ResetTimelineResponse(current_version=request.version, leases_expired=3,
                                                    prompt_index=max(request.prompt_index, self.cursor_floor))


def test_rejoin_dead_letters_the_lost_timeline_and_resets_the_controller():
    buffer, events = make_buffer(BufferConfig(type="memory")), MemoryEvents()
    ids = {i: buffer.put(group(i)) for i in range(6)}  # group i was generated with weights of version i
    buffer.get(2, timeout_s=0)  # two delivered to the dead learner and never acked: still in the buffer
    controller = FakeController(cursor_floor=9)
    timeline = rejoin(buffer, controller, step=2, version=3, batch_size=4, events=events)
    [request] = controller.requests
    # Versions 4 and 5 came from policies that did not survive: dead-lettered with the reason.
    assert [d.reason.startswith("generated with weight version") for d in buffer.dead_letters()] == [True, True]
    assert {e["entry_id"] for e in events.of_kind("group_rejected")} == {ids[4], ids[5]}
    # N_r = 2 steps * B + the 4 surviving one-trajectory groups; the cursor is past every surviving prompt.
    assert (request.version, request.admitted, request.prompt_index) == (3, 2 * 4 + 4, 4)
    assert timeline.cursor == 9  # the controller keeps its cursor when it is further
    survivor = next(e for e in buffer.peek() if e.entry_id == ids[1])
    assert timeline.refusal(survivor) is None
    late = buffer.put(group(7))  # a lease of the lost timeline (prompt 7 < cursor 9) finished after the reset
    [late_entry] = [e for e in buffer.peek() if e.entry_id == late]
    assert "leased on the timeline lost" in timeline.refusal(late_entry)
    fresh = group(9)  # leased after the reset
    buffer.put(fresh)
    assert timeline.refusal(buffer.peek()[-1]) is None
