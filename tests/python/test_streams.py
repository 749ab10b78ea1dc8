"""fp4q._streams: a device's current CUDA stream asked about through torch's raw handle and one
driver call (cuStreamQuery, cuStreamSynchronize), torch's Stream where the driver refuses. The
driver and torch's streams are fakes: no GPU."""

import contextlib
import unittest
from unittest import mock

import torch

from fp4q import _cuda_driver, _streams

CUDA0, CUDA1 = torch.device("cuda", 0), torch.device("cuda", 1)


class StreamsTest(unittest.TestCase):

    def setUp(self):
        self.calls = []  # (what, stream handle) of each driver call
        self.entered = []  # devices made current around a call
        self.handles = {0: 0x5000, 1: 0x6000}  # each device's current stream, torch's raw handle
        self.busy = set()  # handles with work queued
        self.refuse = False

        def query(stream):
            self.calls.append(("query", stream))
            if self.refuse:
                raise _cuda_driver.DriverError("cuStreamQuery(0x%x) failed: "
                                               "CUDA_ERROR_INVALID_CONTEXT" % stream)
            return stream not in self.busy

        def synchronize(stream):
            self.calls.append(("synchronize", stream))
            if self.refuse:
                raise _cuda_driver.DriverError("cuStreamSynchronize(0x%x) failed: "
                                               "CUDA_ERROR_INVALID_CONTEXT" % stream)
            self.busy.discard(stream)

        @contextlib.contextmanager
        def device(d):
            self.entered.append(d)
            yield
        self.torch_stream = mock.Mock()
        self.torch_stream.query.return_value = "torch's answer"
        for p in (mock.patch.object(_cuda_driver, "stream_query", query),
                  mock.patch.object(_cuda_driver, "stream_synchronize", synchronize),
                  mock.patch.object(_streams, "_raw_stream", lambda i: self.handles[i]),
                  mock.patch.object(torch.cuda, "current_device", lambda: 0),
                  mock.patch.object(torch.cuda, "device", device),
                  mock.patch.object(torch.cuda, "current_stream",
                                    return_value=self.torch_stream)):
            p.start()
            self.addCleanup(p.stop)

    def test_idle_asks_the_driver_about_the_device_s_raw_current_stream(self):
        self.busy.add(0x6000)
        self.assertIs(_streams.idle(CUDA0), True)
        self.assertIs(_streams.idle(CUDA1), False)
        self.assertEqual(self.calls, [("query", 0x5000), ("query", 0x6000)])
        self.assertEqual(self.entered, [])  # a stream handle names its own context
        torch.cuda.current_stream.assert_not_called()  # no Stream object made

    def test_synchronize_waits_on_the_device_s_raw_current_stream(self):
        self.busy.add(0x6000)
        _streams.synchronize(CUDA1)
        self.assertEqual((self.calls, self.busy), ([("synchronize", 0x6000)], set()))
        torch.cuda.current_stream.assert_not_called()

    def test_the_default_stream_of_another_device_is_asked_about_under_that_device(self):
        # Handle 0 names the legacy stream of the calling thread's current context.
        self.handles = {0: 0, 1: 0}
        _streams.idle(CUDA1)
        _streams.synchronize(CUDA1)
        self.assertEqual(self.entered, [CUDA1, CUDA1])
        _streams.idle(CUDA0)  # the current device's: as it is
        self.assertEqual((self.calls[-1], len(self.entered)), (("query", 0), 2))

    def test_a_refusing_driver_leaves_the_answer_to_torch_s_stream(self):
        self.refuse = True
        self.assertEqual(_streams.idle(CUDA1), "torch's answer")
        _streams.synchronize(CUDA1)
        self.torch_stream.synchronize.assert_called_once_with()
        self.assertEqual(torch.cuda.current_stream.call_args_list,
                         [mock.call(CUDA1), mock.call(CUDA1)])
        self.assertEqual(self.calls, [("query", 0x6000), ("synchronize", 0x6000)])

    def test_without_torch_s_raw_handle_the_stream_object_s_handle_is_used(self):
        self.torch_stream.cuda_stream = 0x7000
        with mock.patch.object(_streams, "_raw_stream", None):
            self.assertIs(_streams.idle(CUDA0), True)
        self.assertEqual(self.calls, [("query", 0x7000)])


if __name__ == "__main__":
    unittest.main()
