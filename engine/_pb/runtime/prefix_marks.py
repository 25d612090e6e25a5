"""PB_PREFIX_MARKS: every block a prompt fills becomes reusable, under async batching and when a
reply ends at its first token.

Upstream's prefix cache finds a prompt's blocks by the hashes that the batching loop registers
when it updates the step that filled them. Two cases never register them:

- Async batching (on wherever CUDA graphs are, with 0240): the scheduler prepares step N+1 before
  step N's update, and when N+1 holds a prompt's last chunk it already moves the request to
  DECODING. Step N's update registers only PREFILLING requests' chunks, so every chunk of a prompt
  but the last is lost. On an H200 with the production set, an identical 11,177-token prompt sent
  again found 2,816 tokens cached (the last chunk's blocks, hashed from the front), a 20,196-token
  one 11,776; with async batching or CUDA graphs off, 11,008 and 19,968.
- A request that ends with the token its last chunk produced (max_tokens 1, an immediate end of
  turn): the update marks it finished, then skips finished requests when it registers.

With the knob on, a chunk's blocks are registered whether the scheduler has already moved the
request on to decoding or not, and a step's blocks are registered before the token it produced
can finish the request. The blocks and their contents are the same; only whether they are found
again changes.
"""

from .. import knobs


def on() -> bool:
    return bool(knobs.get("PB_PREFIX_MARKS"))


def chunk_moved_on(state) -> bool:
    """A prompt chunk's request that the scheduler already moved to decoding (its last chunk is
    in the next step): its chunk's blocks are registered all the same."""
    from ...generation.continuous_batching.requests import RequestStatus

    return on() and state.status == RequestStatus.DECODING
