"""A streamer for a server `Job` in tests: records each committed canvas, ignores drafts, and signals the end (or
the error message) through `done`."""

import threading


class JobRecorder:
    def __init__(self):
        self.canvases, self.step, self.drafts, self.abandoned = [], 0, False, False
        self.done = threading.Event()
        self.error = None

    def put(self, value):
        self.canvases.append(value.reshape(-1))

    def put_draft(self, value=None, logits=None):
        pass

    def end(self):
        self.done.set()

    def fail(self, message):
        self.error = message
        self.done.set()
