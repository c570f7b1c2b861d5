"""daqflow.open: events, fragments, zero-copy payloads, files cut short, damaged files."""

import pytest

import daqflow
from conftest import COMPLETE, CUT_SHORT, copy_of

np = pytest.importorskip("numpy")


def test_events_give_their_super_fragments_and_fragments(data_dir):
    f = daqflow.open(data_dir / COMPLETE)
    assert (f.run, f.sequence, f.complete, f.trailer_problem) == (1, 1, True, None)
    assert f.writer_version == daqflow.__version__
    ids = []
    for event in f:
        ids.append(event.id)
        assert event.run == 1 and event.flags == 0
        (sf,) = event.super_fragments
        assert (sf.ru_id, sf.event_id, sf.flags, len(sf)) == (0, event.id, 0, 2)
        fragments = sf.fragments
        assert sorted(fr.source_id for fr in fragments) == [0, 1]
        for fr in fragments:
            assert (fr.event_id, fr.run, fr.flags, len(fr), fr.crc_ok) == (event.id, 1, 0, 64, True)
            assert len(fr.payload) == 64
        assert [fr.source_id for fr in event.fragments] == [fr.source_id for fr in fragments]
    assert len(ids) == len(set(ids)) > 0
    assert f.verify().records == len(ids)


def test_payloads_are_views_of_the_bytes_read_not_copies(data_dir):
    event = next(iter(daqflow.open(data_dir / COMPLETE)))
    data = event.data
    assert isinstance(data, memoryview) and data.readonly and len(data) == len(event)
    fragment = event.fragments[0]
    payload = fragment.payload
    assert isinstance(payload.obj, daqflow.Buffer)
    with pytest.raises(TypeError):
        payload[0] = 1
    # The payload lies inside the event's bytes: 48-byte event header, 32-byte super-fragment
    # header, 48-byte fragment header. Same memory, not equal copies.
    whole = np.frombuffer(data, dtype=np.uint8)
    part = np.frombuffer(payload, dtype=np.uint8)
    assert not part.flags.writeable
    address = lambda a: a.__array_interface__["data"][0]
    assert address(part) - address(whole) == 48 + 32 + 48
    assert np.shares_memory(part, whole)
    assert bytes(payload) == bytes(data[128:192])
    # The memory outlives the event and the file.
    del event, data, whole
    assert bytes(part) == bytes(payload)


def test_payload_bytes_are_those_in_the_file(data_dir):
    raw = (data_dir / COMPLETE).read_bytes()
    for event in daqflow.open(data_dir / COMPLETE):
        start = event.offset + 24  # the record header
        assert bytes(event.data) == raw[start:start + len(event)]


def test_a_file_cut_short_is_read_up_to_its_last_whole_event(data_dir):
    whole = [e.id for e in daqflow.open(data_dir / COMPLETE)]
    f = daqflow.open(data_dir / CUT_SHORT)
    assert not f.complete
    assert f.trailer_problem == "no trailer: the file was not closed"
    ids = [e.id for e in f]
    assert ids == whole[: len(whole) // 2]
    report = f.verify()
    assert not report.clean and not report.complete and report.problems == []
    assert report.records == len(ids)
    offset, present, needed = report.cut_short
    assert present == 40 and needed > present
    assert len(f.arrays()) == 2 * len(ids)


def test_a_corrupted_record_is_an_error_and_verify_reports_it(data_dir, tmp_path):
    path = copy_of(data_dir, tmp_path)
    events = list(daqflow.open(path))
    victim = events[3]
    payload_at = victim.offset + 24 + 48 + 32 + 48  # the first fragment's payload
    raw = bytearray(path.read_bytes())
    raw[payload_at] ^= 0xFF
    path.write_bytes(bytes(raw))

    f = daqflow.open(path)
    report = f.verify()
    assert not report.clean and report.complete and report.records == len(events)
    assert len(report.problems) == 1
    assert f"record 3 (event {victim.id})" in report.problems[0]
    assert "CRC32C" in report.problems[0]
    assert report.as_dict()["problems"] == report.problems

    with pytest.raises(daqflow.CorruptDataError, match=f"record 3 \\(event {victim.id}\\) at offset {victim.offset}"):
        for _ in f:
            pass
    assert issubclass(daqflow.CorruptDataError, daqflow.Error)
    kept = [e.id for e in f.events(skip_damaged=True)]
    assert kept == [e.id for e in events if e.id != victim.id]
    with pytest.raises(daqflow.CorruptDataError):
        f.arrays()
    assert f.arrays(skip_damaged=True).events == len(events) - 1


def test_garbage_between_records_is_reported(data_dir, tmp_path):
    path = copy_of(data_dir, tmp_path)
    events = list(daqflow.open(path))
    raw = bytearray(path.read_bytes())
    raw[events[2].offset:events[2].offset + 8] = b"GARBAGE!"  # the record header of event 2
    path.write_bytes(bytes(raw))
    f = daqflow.open(path)
    problems = f.verify().problems
    assert any("are not records" in p for p in problems), problems
    with pytest.raises(daqflow.CorruptDataError, match="are not records"):
        list(f)
    assert len(list(f.events(skip_damaged=True))) == len(events) - 1


def test_files_that_are_not_data_files_are_errors(tmp_path):
    with pytest.raises(FileNotFoundError) as missing:
        daqflow.open(tmp_path / "missing.daq")
    assert missing.value.filename == str(tmp_path / "missing.daq")
    text = tmp_path / "text.daq"
    text.write_text("not a data file, but long enough to hold a header " * 4)
    with pytest.raises(daqflow.FormatError, match="not a daqflow data file"):
        daqflow.open(text)
    empty = tmp_path / "empty.daq"
    empty.write_bytes(b"")
    with pytest.raises(daqflow.FormatError):
        daqflow.open(empty)
    with pytest.raises(IsADirectoryError):
        list(daqflow.open(tmp_path))


def test_arrays_hold_every_fragment_of_the_file(data_dir):
    f = daqflow.open(data_dir / COMPLETE)
    a = f.arrays()
    events = list(f)
    fragments = [fr for e in events for fr in e.fragments]
    assert a.events == len(events) and len(a) == len(fragments)
    assert a.event_ids.dtype == np.uint64 and a.source_ids.dtype == np.uint32
    assert a.sizes.dtype == np.uint32 and a.offsets.dtype == np.uint64 and a.payload.dtype == np.uint8
    assert a.event_ids.tolist() == [fr.event_id for fr in fragments]
    assert a.source_ids.tolist() == [fr.source_id for fr in fragments]
    assert a.flags.tolist() == [fr.flags for fr in fragments]
    assert a.sizes.tolist() == [len(fr) for fr in fragments]
    assert a.payload.nbytes == int(a.sizes.sum())
    for i in (0, len(fragments) // 2, len(fragments) - 1):
        o, n = int(a.offsets[i]), int(a.sizes[i])
        assert a.payload[o:o + n].tobytes() == bytes(fragments[i].payload)
    # The arrays are read-only views of memory Rust allocated, not copies.
    for arr in (a.event_ids, a.source_ids, a.flags, a.sizes, a.offsets, a.payload):
        assert not arr.flags.writeable
        assert isinstance(arr.base, daqflow.Buffer)
    assert len(a.payload.base) == a.payload.nbytes


def test_verify_of_a_clean_file(data_dir):
    report = daqflow.open(data_dir / COMPLETE).verify()
    assert report.clean and report.complete and report.problems == [] and report.cut_short is None
    assert report.events_checked == report.records > 0
    shallow = daqflow.open(data_dir / COMPLETE).verify(deep=False)
    assert shallow.clean and shallow.events_checked == 0


# --- decode_event: the same events from bytes held elsewhere (an ET event, a socket) --------


def fragments_of(event):
    return [(f.source_id, f.event_id, f.run, f.trigger_type, f.timestamp, f.flags, f.crc_ok, bytes(f.payload))
            for f in event.fragments]


def test_decode_event_gives_the_event_a_file_gives(data_dir):
    for from_file in daqflow.open(data_dir / COMPLETE):
        for data in (bytes(from_file.data), bytearray(from_file.data), from_file.data,
                     np.frombuffer(from_file.data, dtype=np.uint8)):
            event = daqflow.decode_event(data)
            assert isinstance(event, daqflow.Event)
            assert (event.id, event.run, event.flags, event.trigger_type, event.bu_id, len(event)) == (
                from_file.id, from_file.run, from_file.flags, from_file.trigger_type, from_file.bu_id, len(from_file))
            assert (event.index, event.offset) == (None, None)
            assert bytes(event.data) == bytes(from_file.data)
            assert [(s.ru_id, s.event_id, s.flags, len(s)) for s in event.super_fragments] == [
                (s.ru_id, s.event_id, s.flags, len(s)) for s in from_file.super_fragments]
            assert fragments_of(event) == fragments_of(from_file)


def test_decode_event_reads_the_buffer_in_place_unless_asked_to_copy(data_dir):
    source = next(iter(daqflow.open(data_dir / COMPLETE)))
    data = bytearray(source.data)
    event = daqflow.decode_event(data)
    copied = daqflow.decode_event(data, copy=True)
    payload = event.fragments[0].payload
    # The payload is the bytearray's memory: a write into it shows; the copy does not change.
    data[48 + 32 + 48] ^= 0xFF
    assert payload[0] == data[128] != copied.fragments[0].payload[0]
    assert not event.fragments[0].crc_ok and copied.fragments[0].crc_ok
    # While the event (or any view of it) lives, the bytearray is held: it cannot be resized.
    del event
    with pytest.raises(BufferError):
        data.append(0)
    del payload
    data.append(0)  # released with the last view
    assert copied.fragments[0].crc_ok


def test_decode_event_checks_every_crc_and_the_structure(data_dir):
    event = next(iter(daqflow.open(data_dir / COMPLETE)))
    source, first = bytes(event.data), event.fragments[0].source_id
    damaged = bytearray(source)
    damaged[48 + 32 + 48 + 3] ^= 0x01          # a payload byte of the first fragment
    with pytest.raises(daqflow.CorruptDataError, match=rf"event {event.id}: the payload CRC32C of source {first}'s fragment"):
        daqflow.decode_event(damaged)
    # Without the walk it decodes, and the fragment says so.
    assert [f.crc_ok for f in daqflow.decode_event(damaged, verify=False).fragments] == [False, True]
    # An event the builder flagged CRC_ERROR (flags bit 1) is data, delivered as it is.
    damaged[8] |= 2
    flagged = daqflow.decode_event(damaged)
    assert flagged.flags & 2 and [f.crc_ok for f in flagged.fragments] == [False, True]
    # Not an event at all, or cut short, or with bytes to spare: refused with the reason.
    for bad, reason in [(b"DQFLFILE" + bytes(60), "not a daqflow event"), (source[:40], "cannot hold a daqflow event"),
                        (source[:-8], "header says"), (source + bytes(8), "header says")]:
        with pytest.raises(daqflow.CorruptDataError, match=reason):
            daqflow.decode_event(bad)
    # A super-fragment that claims more fragments than it holds is malformed.
    broken = bytearray(source)
    broken[48 + 24] += 1                        # the super-fragment's fragment count
    with pytest.raises(daqflow.CorruptDataError, match=r"^the event|^event \d+"):
        daqflow.decode_event(broken)
    with pytest.raises(TypeError):
        daqflow.decode_event("DEVT")            # text has no buffer
