//! The data formats (`crates/wire`): a fragment, a super-fragment and an event parsed from the
//! same bytes, walked and checked as a BU and a reader do; headers round-trip.
#![no_main]

use daqflow_wire::{Event, EventHeader, Fragment, FragmentHeader, SuperFragment, SuperFragmentHeader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let bytes = daqflow_fuzz::bytes(data);
    if let Ok(f) = Fragment::parse(bytes.clone()) {
        assert_eq!(FragmentHeader::decode(&f.header().encode()).as_ref(), Ok(f.header()));
        assert_eq!(f.payload_slice().len(), f.header().payload_len as usize);
        let _ = f.verify_crc();
    }
    if let Ok(sf) = SuperFragment::parse(bytes.clone()) {
        assert_eq!(SuperFragmentHeader::decode(&sf.header().encode()).as_ref(), Ok(sf.header()));
        for f in sf.fragments() {
            let Ok(f) = f else { break };
            let _ = f.verify_crc();
        }
    }
    if let Ok(e) = Event::parse(bytes) {
        assert_eq!(EventHeader::decode(&e.header().encode()).as_ref(), Ok(e.header()));
        if let Ok(check) = e.check() {
            let _ = (check.is_clean(), check.flags());
        }
    }
});
