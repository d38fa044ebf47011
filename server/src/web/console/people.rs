//! The people who may sign in (admins manage them): add, remove, change a
//! role, reset a password; people defined in the company file are changed
//! there, not here.

use app::api::{NewPerson, Person, PersonRole, PersonView};
use app::console::ConsoleError;

use crate::web::unavailable::unavailable;

use super::{NodeConsole, clip};

pub(super) async fn list(c: &NodeConsole) -> Result<Vec<PersonView>, ConsoleError> {
    c.auth
        .people()
        .await
        .map_err(|e| unavailable("read the people list", e))
}

pub(super) async fn add(
    c: &NodeConsole,
    actor: &Person,
    name: &str,
    role: PersonRole,
) -> Result<NewPerson, ConsoleError> {
    let name = name.trim();
    let reason = format!("{} as {role}", clip(name));
    c.admit_admin(actor, "person.add", &reason, "add people")
        .await?;
    let bad = name.is_empty()
        || name.len() > 64
        || name.chars().any(|c| c.is_control() || c.is_whitespace());
    if bad {
        c.audited(actor, "person.add", Some(&reason), "refused: invalid name")
            .await?;
        return Err(ConsoleError::Invalid(
            "Name: use 1–64 characters with no spaces (for example \"alice\").".into(),
        ));
    }
    if c.auth
        .exists(name)
        .await
        .map_err(|e| unavailable("check the name", e))?
    {
        c.audited(actor, "person.add", Some(&reason), "refused: name taken")
            .await?;
        return Err(ConsoleError::Invalid(format!(
            "Name: {name:?} can already sign in. Pick another name."
        )));
    }
    let password = c
        .auth
        .add(name, role, &actor.name)
        .await
        .map_err(|e| unavailable("add the person", e))?;
    c.audited(actor, "person.add", Some(&reason), "ok").await?;
    Ok(NewPerson {
        name: name.to_string(),
        role,
        password,
    })
}

pub(super) async fn remove(
    c: &NodeConsole,
    actor: &Person,
    name: &str,
) -> Result<(), ConsoleError> {
    const ACTION: &str = "person.remove";
    let shown = clip(name);
    c.admit_admin(actor, ACTION, &shown, "remove people")
        .await?;
    if name == actor.name {
        c.audited(actor, ACTION, Some(&shown), "refused: oneself")
            .await?;
        return Err(ConsoleError::Invalid(
            "You cannot remove yourself: ask another admin.".into(),
        ));
    }
    c.changeable(actor, ACTION, name).await?;
    let removed = c
        .auth
        .remove(name)
        .await
        .map_err(|e| unavailable("remove the person", e))?;
    if !removed {
        c.audited(actor, ACTION, Some(&shown), "refused: no such person")
            .await?;
        return Err(ConsoleError::NotFound(format!(
            "Nobody named {shown:?} can sign in here."
        )));
    }
    c.audited(actor, ACTION, Some(&shown), "ok").await
}

pub(super) async fn set_role(
    c: &NodeConsole,
    actor: &Person,
    name: &str,
    role: PersonRole,
) -> Result<(), ConsoleError> {
    const ACTION: &str = "person.set_role";
    let reason = format!("{} to {role}", clip(name));
    c.admit_admin(actor, ACTION, &reason, "change a person's role")
        .await?;
    if name == actor.name && role != PersonRole::Admin {
        c.audited(actor, ACTION, Some(&reason), "refused: oneself")
            .await?;
        return Err(ConsoleError::Invalid(
            "You cannot take away your own admin role: ask another admin.".into(),
        ));
    }
    c.changeable(actor, ACTION, name).await?;
    let changed = c
        .auth
        .set_role(name, role)
        .await
        .map_err(|e| unavailable("change the role", e))?;
    if !changed {
        c.audited(actor, ACTION, Some(&reason), "refused: no such person")
            .await?;
        return Err(ConsoleError::NotFound(format!(
            "Nobody named {:?} can sign in here.",
            clip(name)
        )));
    }
    c.audited(actor, ACTION, Some(&reason), "ok").await
}

pub(super) async fn reset_password(
    c: &NodeConsole,
    actor: &Person,
    name: &str,
) -> Result<NewPerson, ConsoleError> {
    const ACTION: &str = "person.reset_password";
    let shown = clip(name);
    c.admit_admin(actor, ACTION, &shown, "reset a password")
        .await?;
    c.changeable(actor, ACTION, name).await?;
    let standing = c
        .auth
        .standing(name)
        .await
        .map_err(|e| unavailable("read the person", e))?;
    let password = c
        .auth
        .reset_password(name)
        .await
        .map_err(|e| unavailable("reset the password", e))?;
    let (Some(password), Some(standing)) = (password, standing) else {
        c.audited(actor, ACTION, Some(&shown), "refused: no such person")
            .await?;
        return Err(ConsoleError::NotFound(format!(
            "Nobody named {shown:?} can sign in here."
        )));
    };
    c.audited(actor, ACTION, Some(&shown), "ok").await?;
    Ok(NewPerson {
        name: name.to_string(),
        role: standing.role,
        password,
    })
}
