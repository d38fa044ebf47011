//! Settings › People: who may sign in, adding a person (operators), and the
//! audit log of every person's action (also on its own page, `/audit`).

use leptos::prelude::*;

use crate::api::PersonView;
use crate::components::audit::AuditTable;
use crate::components::notice::ErrorNotice;
use crate::fns::{AddPerson, audit_log, people, whoami};

#[component]
pub fn PeoplePage() -> impl IntoView {
    let add = ServerAction::<AddPerson>::new();
    let list = Resource::new(move || add.version().get(), |_| people());
    let audit = Resource::new(move || add.version().get(), |_| audit_log());
    let me = Resource::new(|| (), |_| whoami());
    // Viewers see the controls disabled; the node refuses them anyway.
    let viewer = move || {
        me.get()
            .and_then(|r| r.ok())
            .is_none_or(|p| !p.is_operator())
    };
    view! {
        <section class="page">
            <h1>"Settings › People"</h1>
            <Suspense fallback=|| view! { <p class="muted">"Reading…"</p> }>
                {move || {
                    list.get()
                        .map(|r| match r {
                            Ok(v) => view! { <PeopleTable people=v /> }.into_any(),
                            Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
                        })
                }}
            </Suspense>
            <h2>"Add a person"</h2>
            <ActionForm action=add attr:class="inline-form">
                <label for="new-name">"Name"</label>
                <input id="new-name" name="name" type="text" required />
                <label for="new-role">"Role"</label>
                <select id="new-role" name="role">
                    <option value="viewer">"viewer"</option>
                    <option value="operator">"operator"</option>
                </select>
                <Transition fallback=|| view! { <button type="submit" disabled=true>"Add"</button> }>
                    <button type="submit" disabled=viewer>"Add"</button>
                    {move || viewer().then(|| view! { <span class="muted small">"Only operators may add people."</span> })}
                </Transition>
            </ActionForm>
            {move || {
                add.value()
                    .get()
                    .map(|r| match r {
                        Ok(p) => {
                            view! {
                                <p class="notice notice-info" role="status">
                                    {format!("{} ({}) can now sign in with the password ", p.name, p.role)}
                                    <code class="mono">{p.password}</code>
                                    ". It is shown once: hand it over now."
                                </p>
                            }
                                .into_any()
                        }
                        Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
                    })
            }}
            <h2>"Audit"</h2>
            <Suspense fallback=|| ()>
                {move || {
                    audit.get()
                        .map(|r| match r {
                            Ok(v) => view! { <AuditTable entries=v.entries /> }.into_any(),
                            Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
                        })
                }}
            </Suspense>
        </section>
    }
}

#[component]
fn PeopleTable(people: Vec<PersonView>) -> impl IntoView {
    view! {
        <div class="table-wrap">
            <table>
                <thead>
                    <tr>
                        <th scope="col">"Name"</th>
                        <th scope="col">"Role"</th>
                        <th scope="col">"Defined in"</th>
                    </tr>
                </thead>
                <tbody>
                    {people
                        .into_iter()
                        .map(|p| {
                            view! {
                                <tr>
                                    <td>{p.name}</td>
                                    <td>{p.role.as_str()}</td>
                                    <td>{p.source}</td>
                                </tr>
                            }
                        })
                        .collect_view()}
                </tbody>
            </table>
        </div>
    }
}
