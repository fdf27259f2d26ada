use nobubble_schedule::paper::*;
fn main() {
    for s in SETTINGS {
        let mut line = format!("{:6} p{:2} m{:3}", s.model, s.p, s.m);
        for (k, col) in COMPARED {
            let ours = bubble_rate(&s, k).unwrap();
            line += &format!("  {}: {:.4}/{:.4}", k.name(), ours, s.reported[col]);
        }
        println!("{line}");
    }
}
