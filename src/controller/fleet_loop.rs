//! The fleet loop: a fleet pass after each burst of changes (or the resync), then the health
//! taints from what it counted, then the model capacity count when it is due. The two loops
//! meet only here: the fleet pass returns its figures and this runner hands them to the taint
//! pass, so neither `controller/fleet/` nor `controller/taints/` imports the other.

use std::sync::Arc;
use std::time::Duration;

use crate::controller::context::Context;
use crate::controller::fleet::pass::{self, CapacityCounting, Memory};
use crate::controller::taints::core::HealthTaints;
use crate::controller::taints::sync::Taints;

/// Runs the loop until the future is dropped (it lives as long as the controller).
pub(crate) async fn run(
    ctx: Arc<Context>,
    (mode, taint_check): (HealthTaints, Duration),
    selector: Option<String>,
    counting: CapacityCounting,
) {
    let mut memory = Memory::default();
    let mut taints = Taints::new(&ctx, mode, selector, taint_check).await;
    loop {
        fleet_and_taints(&ctx, &mut memory, &mut taints).await;
        pass::count_models(&ctx, &mut memory, &counting).await;
        pass::next_pass(&ctx).await;
    }
}

/// One fleet pass, then the health taints from its figures (when taints are on and the pass
/// built the planner's view, which it does whenever they are).
pub(crate) async fn fleet_and_taints(ctx: &Context, memory: &mut Memory, taints: &mut Taints) {
    let figures = pass::pass(ctx, memory, taints.active()).await;
    if let Some(view) = figures.view.filter(|_| taints.active()) {
        taints.sync(ctx, &figures.stats, &view).await;
    }
}
