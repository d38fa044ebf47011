//! Settings › People: who may sign in; admins add people, change a role,
//! reset a password and remove a person (people defined in the company
//! file are changed there); and the audit log of every person's action
//! (also on its own page, `/audit`).

use leptos::prelude::*;

use crate::api::{NewPerson, PersonRole, PersonView};
use crate::components::audit::AuditTable;
use crate::components::notice::ErrorNotice;
use crate::error::AppError;
use crate::fns::{
    AddPerson, RemovePerson, ResetPassword, SetPersonRole, audit_log, people, whoami,
};

#[component]
pub fn PeoplePage() -> impl IntoView {
    let add = ServerAction::<AddPerson>::new();
    let remove = ServerAction::<RemovePerson>::new();
    let set_role = ServerAction::<SetPersonRole>::new();
    let reset = ServerAction::<ResetPassword>::new();
    let changed = move || {
        (
            add.version().get(),
            remove.version().get(),
            set_role.version().get(),
            reset.version().get(),
        )
    };
    let list = Resource::new(changed, |_| people());
    let audit = Resource::new(changed, |_| {
        audit_log(String::new(), String::new(), String::new(), false, 1)
    });
    let me = Resource::new(|| (), |_| whoami());
    // Only admins see the controls enabled; the node refuses the others
    // anyway (and audits the refusal).
    let not_admin = move || me.get().and_then(|r| r.ok()).is_none_or(|p| !p.is_admin());
    let my_name = move || me.get().and_then(|r| r.ok()).map(|p| p.name);
    view! {
        <section class="page">
            <leptos_meta::Title text="People" />
                <h1>"Settings › People"</h1>
            <Suspense fallback=|| view! { <p class="muted">"Reading…"</p> }>
                {move || {
                    list.get()
                        .map(|r| match r {
                            Ok(v) => {
                                view! {
                                    <PeopleTable
                                        people=v
                                        admin=!not_admin()
                                        me=my_name().unwrap_or_default()
                                        remove=remove
                                        set_role=set_role
                                        reset=reset
                                    />
                                }
                                    .into_any()
                            }
                            Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
                        })
                }}
            </Suspense>
            <Outcome result=Signal::derive(move || remove.value().get().map(|r| r.map(|_| "Removed: they can no longer sign in, and their open pages stop.".to_string()))) />
            <Outcome result=Signal::derive(move || set_role.value().get().map(|r| r.map(|_| "Role changed: it holds from their next request.".to_string()))) />
            <NewPassword result=Signal::derive(move || reset.value().get()) verb="has the new password" />
            <h2>"Add a person"</h2>
            <ActionForm action=add attr:class="inline-form">
                <label for="new-name">"Name"</label>
                <input id="new-name" name="name" type="text" required maxlength="64" />
                <label for="new-role">"Role"</label>
                <RoleSelect id="new-role" selected=PersonRole::Viewer />
                <Transition fallback=|| view! { <button type="submit" disabled=true>"Add"</button> }>
                    <button type="submit" disabled=not_admin>"Add"</button>
                    {move || not_admin().then(|| view! { <span class="muted small">"Only admins may add people."</span> })}
                </Transition>
            </ActionForm>
            <NewPassword result=Signal::derive(move || add.value().get()) verb="can now sign in with the password" />
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

/// A role picker (`name="role"`).
#[component]
fn RoleSelect(#[prop(into)] id: String, selected: PersonRole) -> impl IntoView {
    view! {
        <select id=id name="role">
            {PersonRole::ALL
                .into_iter()
                .map(|r| view! { <option value=r.as_str() selected=r == selected>{r.as_str()}</option> })
                .collect_view()}
        </select>
    }
}

/// What an action came to: its sentence, or the node's refusal.
#[component]
fn Outcome(result: Signal<Option<Result<String, AppError>>>) -> impl IntoView {
    move || {
        result.get().map(|r| match r {
            Ok(s) => view! { <p class="notice notice-info" role="status">{s}</p> }.into_any(),
            Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
        })
    }
}

/// A generated password, shown once.
#[component]
fn NewPassword(
    result: Signal<Option<Result<NewPerson, AppError>>>,
    verb: &'static str,
) -> impl IntoView {
    move || {
        result.get().map(|r| match r {
            Ok(p) => view! {
                <p class="notice notice-info" role="status">
                    {format!("{} ({}) {verb} ", p.name, p.role)}
                    <code class="mono">{p.password}</code>
                    ". It is shown once: hand it over now. They choose their own at their next sign-in."
                </p>
            }
                .into_any(),
            Err(e) => view! { <ErrorNotice error=e /> }.into_any(),
        })
    }
}

#[component]
fn PeopleTable(
    people: Vec<PersonView>,
    admin: bool,
    me: String,
    remove: ServerAction<RemovePerson>,
    set_role: ServerAction<SetPersonRole>,
    reset: ServerAction<ResetPassword>,
) -> impl IntoView {
    view! {
        <div class="table-wrap">
            <table>
                <thead>
                    <tr>
                        <th scope="col">"Name"</th>
                        <th scope="col">"Role"</th>
                        <th scope="col">"Defined in"</th>
                        <th scope="col">"Actions"</th>
                    </tr>
                </thead>
                <tbody>
                    {people
                        .into_iter()
                        .map(|p| {
                            let in_file = p.source == "file";
                            let actions = if !admin {
                                view! { <span class="muted small">"—"</span> }.into_any()
                            } else if in_file {
                                view! { <span class="muted small">"change it in the company file"</span> }.into_any()
                            } else {
                                let name = p.name.clone();
                                let select_id = format!("role-{}", p.name);
                                let myself = p.name == me;
                                let role_label = format!("Role of {name}");
                                let remove_label = format!("Remove {name} for good");
                                let (n1, n2, n3) = (name.clone(), name.clone(), name);
                                view! {
                                    <div class="row-actions">
                                        <ActionForm action=set_role attr:class="inline-form">
                                            <input type="hidden" name="name" value=n1 />
                                            <label class="visually-hidden" for=select_id.clone()>{role_label}</label>
                                            <RoleSelect id=select_id selected=p.role />
                                            <button type="submit">"Change role"</button>
                                        </ActionForm>
                                        <ActionForm action=reset attr:class="inline-form">
                                            <input type="hidden" name="name" value=n2 />
                                            <button type="submit">"Reset password"</button>
                                        </ActionForm>
                                        {(!myself).then(|| view! {
                                            <details class="confirm-inline">
                                                <summary>"Remove…"</summary>
                                                <ActionForm action=remove attr:class="inline-form">
                                                    <input type="hidden" name="name" value=n3 />
                                                    <button type="submit" class="danger">{remove_label}</button>
                                                </ActionForm>
                                            </details>
                                        })}
                                    </div>
                                }
                                    .into_any()
                            };
                            view! {
                                <tr>
                                    <td>
                                        {p.name.clone()}
                                        {p.must_change_password.then(|| view! { <span class="muted small">" (password to change)"</span> })}
                                    </td>
                                    <td>{p.role.as_str()}</td>
                                    <td>{p.source.clone()}</td>
                                    <td>{actions}</td>
                                </tr>
                            }
                        })
                        .collect_view()}
                </tbody>
            </table>
        </div>
    }
}
